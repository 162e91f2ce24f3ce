"""`potluck launch` runs a job to its end with real peer processes; a peer with too little memory is kept
as a spare and told why; `potluck status` shows the plan and the progress."""

import json

import pytest

from potluck.testbed.localswarm import LocalSwarm
from tests.helpers.swarm import status_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

JOB = """
name = "launch-test"
steps = 8
min_peers = 2
[model]
n_layers = 2
d_model = 128
n_heads = 4
vocab_size = 256
seq_len = 16
[batch]
tokens_per_step = 128
micro_batch_size = 2
[data]
generated_chars = 20000
[checkpoint]
dir = "{ckpt}"
interval = 4
[limits]
stages = 2
replicas = 1
"""


def test_launch_trains_to_the_end_and_explains_spares(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(ckpt=tmp_path / "ckpt"))
    peer_args = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu")
    with LocalSwarm(
        tmp_path / "run", job, swarm_id="launch-test", peer_args=peer_args, coordinator_args=("--json",)
    ) as swarm:
        swarm.start_coordinator()
        swarm.start_peer("small", "--max-memory", "1MiB")  # cannot hold one 128-wide layer
        swarm.start_peer("a")
        swarm.start_peer("b")
        coordinator = swarm.procs["coordinator"]
        coordinator.popen.wait(timeout=240)  # launch ends by itself at the job's last step
        log = coordinator.log.read_text()
        assert coordinator.popen.returncode == 0, log[-3000:]
        summary = json.loads([line for line in log.splitlines() if line.startswith('{"steps"')][-1])
        assert summary["steps"] == 8 and summary["stages"] == 2 and summary["replicas"] == 1
        assert summary["checkpoint"].endswith("step-00000008")
        assert "too little memory" in log  # the plan table lists the spare and why
    assert (tmp_path / "ckpt" / "step-00000008" / "stage-001.json").exists()


def test_status_shows_plan_and_progress(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(ckpt=tmp_path / "ckpt").replace("steps = 8", "steps = 400"))
    peer_args = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu")
    with LocalSwarm(tmp_path / "run", job, swarm_id="status-test", peer_args=peer_args) as swarm:
        invite = swarm.start_coordinator()
        swarm.start_peer("a")
        swarm.start_peer("b")
        doc: dict = {}
        for _ in range(60):
            doc = status_json(invite)
            if doc["plan"] and any(r["step"] >= 2 for r in doc["progress"]):
                break
        assert doc["plan"]["status"] == "training" and len(doc["plan"]["stages"]) == 2
        states = {r["peer_id"]: r for r in doc["progress"]}
        assert len(states) == 2 and all(r["state"] == "training" for r in states.values())
        assert any(r["loss"] is not None and r["timing"]["total"] > 0 for r in states.values())
