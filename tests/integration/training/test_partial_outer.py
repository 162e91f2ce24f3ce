"""Partial participation in the coded outer sync on real p2pd (in-process peers on loopback): one of
three replicas uploads its outer payloads 3 s late (a slow home uplink). Under ``sync.policy =
"deadline"`` the stage leaves it out of those syncs instead of waiting: every step commits, the
late replica applies the same outer steps and stays bit-identical, and its work waits in its residual."""

import asyncio

import pytest
import torch

from potluck.net.config import TransportConfig
from potluck.net.mailbox import Mailbox
from potluck.net.tags import INDEX_BITS, Stream, Tag
from potluck.testbed.harness.training import PROTOCOL, tiny_job, train_swarm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

N, LATE, STEPS = 3, 2, 8


class SlowUplink(Mailbox):
    async def send(self, peer: str, tag: Tag, payload: bytes) -> None:
        if tag.stream >> INDEX_BITS == Stream.GATHER:
            await asyncio.sleep(3.0)
        await super().send(peer, tag, payload)


def test_a_replica_with_a_slow_uplink_is_left_out_of_outer_syncs_and_stays_identical(tmp_path):
    job = tiny_job(
        steps=STEPS,
        batch={"tokens_per_step": 16 * 6},  # 2 sequences a replica
        compression={"sync_every": 2, "outer": "int2:block=32|zstd"},
        sync={"policy": "deadline", "min_deadline_s": 0.5, "deadline_factor": 1.0},
    )

    def box(replica: int, node):  # type: ignore[no-untyped-def]
        cls = SlowUplink if replica == LATE else Mailbox
        return cls(node, PROTOCOL, TransportConfig(timeout_s=30))

    reports, trainers = asyncio.run(train_swarm(job, 1, N, [(0, 4)], tmp_path, make_box=box))
    assert all(len(r) == STEPS for r in reports.values())  # no step lost
    late = trainers[(0, LATE)].lateness
    assert late is not None and late.missed == STEPS // 2  # every outer sync went on without it
    assert all(trainers[(0, i)].lateness.missed == 0 for i in range(N) if i != LATE)  # type: ignore[union-attr]
    params = [trainers[(0, i)].runner.params for i in range(N)]
    for other in params[1:]:
        assert all(torch.equal(a, b) for a, b in zip(params[0], other, strict=True))
