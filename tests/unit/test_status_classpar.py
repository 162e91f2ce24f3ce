"""``potluck status`` shows a class-parallel job's plan (its workers and their peers), as text and JSON."""

import json

from typer.testing import CliRunner

import potluck.net.client as client_module
from potluck.cli import app
from potluck.net.client import SwarmReading
from potluck.protocol.classpar import ClassParPlan
from potluck.protocol.identity import Identity
from potluck.protocol.invite import Invite

PEERS = sorted(Identity.generate().peer_id for _ in range(3))
PLAN = ClassParPlan(
    job="bars",
    epoch=3,
    status="serving",
    teacher=PEERS[0],
    teacher_sha256="ab" * 32,
    num_classes=10,
    groups=[[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]],
    parity=1,
    workers=PEERS,
    issued_at=0.0,
)


def test_status_lists_the_class_parallel_workers(monkeypatch):
    async def read_swarm(invite, net, timeout_s):
        return SwarmReading([], {}, None, [], classpar=PLAN)

    monkeypatch.setattr(client_module, "read_swarm", read_swarm)
    coordinator = Identity.generate()
    invite = Invite("swarm-a", (f"/ip4/127.0.0.1/tcp/1/p2p/{coordinator.peer_id}",), coordinator.public_key)
    text = CliRunner().invoke(app, ["status", "--join", invite.encode()])
    assert text.exit_code == 0, text.output
    assert "class-parallel job bars: serving (plan epoch 3)" in text.output
    assert f"worker 2: {PEERS[2]} (parity)" in text.output
    doc = CliRunner().invoke(app, ["status", "--join", invite.encode(), "--json"])
    assert json.loads(doc.output)["classpar"]["workers"] == PEERS
