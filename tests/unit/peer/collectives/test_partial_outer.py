"""Partial participation in the coded outer sync (``sync.policy = "deadline"``, collectives/partial.py):
the leader takes in the payloads that came by its deadline, every replica steps on exactly those, a
replica left out keeps what it sent in its residual and stays bit-identical with the others."""

from __future__ import annotations

import asyncio

import pytest
import torch

from potluck.net.tags import INDEX_BITS, Round, Stream, Tag
from potluck.peer.collectives.partial import decode_members, encode_members
from potluck.peer.errors import StragglerError
from potluck.peer.train.outer import Lateness, outer_step, stage_gather
from potluck.peer.train.pipeline import Timing
from tests.unit.peer.collectives.test_gather import PEERS, MemBox, no_allreduce, stage


class SlowUplink(MemBox):
    """Its outer payloads reach the others ``delay_s`` late (a home uplink)."""

    delay_s = 0.0

    async def send(self, peer: str, tag: Tag, payload: bytes) -> None:
        if tag.stream >> INDEX_BITS == Stream.GATHER:
            await asyncio.sleep(self.delay_s)
        await super().send(peer, tag, payload)


def test_the_decision_is_a_bitmask_with_the_leader():
    assert decode_members(encode_members([0, 2, 9], 10), 10) == [0, 2, 9]
    for bad in (b"\x06\x00", b"\x01", b"\x01\x04"):  # no leader; wrong size; a bit past 10 replicas
        with pytest.raises(ValueError):
            decode_members(bad, 10)
    late = Lateness(max_misses=2)
    late.note(True)
    late.note(False)
    late.note(True)
    with pytest.raises(StragglerError, match="2 outer syncs in a row"):
        late.note(True)
    assert late.missed == 3


def test_a_late_replica_is_left_out_keeps_its_work_and_stays_identical():
    models, dilocos = stage(3)
    lateness = [Lateness(10) for _ in PEERS]
    residual_norms = []
    before_sync: list[torch.Tensor] = []  # peer-c's pseudo-gradient as it enters each sync

    async def run(delays: list[float]) -> None:
        wires: dict = {}
        boxes = [SlowUplink(p, wires) for p in PEERS]
        for box, delay in zip(boxes, delays, strict=True):
            box.delay_s = delay
        for step in range(2):  # sync_every = 2: one outer sync
            for k, m in enumerate(models):
                with torch.no_grad():
                    for p in m.parameters():
                        p.add_(0.01 * (k + 1) * torch.randn_like(p))
            rnd = Round(1, 2 * len(residual_norms) + step)
            if step == 1:
                before_sync.append(dilocos[2].pseudo_gradient())
            await asyncio.gather(
                *(
                    outer_step(
                        d,
                        no_allreduce,
                        stage_gather(b, PEERS, d, rnd, 5.0, Timing(), deadline_s=0.2, lateness=late),  # type: ignore[arg-type]
                        PEERS,
                    )
                    for b, d, late in zip(boxes, dilocos, lateness, strict=True)
                )
            )
        residual_norms.append([float(sum(ef.residual.norm() for ef in d.feedback)) for d in dilocos])

    asyncio.run(run([0.0, 0.0, 1.0]))  # peer-c's payloads come a second late: left out
    assert [late.missed for late in lateness] == [0, 0, 1]
    ref = list(models[0].parameters())
    for m in models[1:]:
        assert all(torch.equal(a, b) for a, b in zip(ref, m.parameters(), strict=True))
    # what peer-c sent went back into its residual: all of its pseudo-gradient waits for the next sync
    held = torch.cat([ef.residual for ef in dilocos[2].feedback])
    torch.testing.assert_close(held, before_sync[0], rtol=0, atol=1e-6)
    asyncio.run(run([0.0, 0.0, 0.0]))  # on time: in again, and its held-back work goes out
    assert [late.missed for late in lateness] == [0, 0, 1] and lateness[2].in_a_row == 0
    for m in models[1:]:
        assert all(torch.equal(a, b) for a, b in zip(ref, m.parameters(), strict=True))
