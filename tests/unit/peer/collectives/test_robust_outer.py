"""The coded outer sync in an untrusted swarm (``trust.aggregation = "trimmed_mean"``): replicas compare
what they gathered (``gather.echo``), a replica that sends different payloads to different replicas
fails the sync, and one that sends inflated or garbage payloads to everyone is trimmed or left out on
every replica alike, so honest replicas stay bit-identical and its pull on the weights stays bounded."""

from __future__ import annotations

import asyncio

import pytest
import torch

from potluck.net.tags import Phase, Round, Stream, make_tag
from potluck.peer.collectives.diloco import OuterCodec
from potluck.peer.collectives.gather import digests, echo, gather_tag
from potluck.peer.collectives.robust import Audit, ordered_trimmed_mean
from potluck.peer.errors import CollectiveError
from potluck.peer.train.outer import outer_codec, outer_step, stage_gather
from potluck.peer.train.pipeline import Timing
from potluck.protocol.jobspec import TrustSpec
from tests.unit.peer.collectives.test_gather import COMP, MemBox, no_allreduce, stage

PEERS = ["peer-a", "peer-b", "peer-c", "peer-d"]
TRIMMED = TrustSpec(aggregation="trimmed_mean", trim=0.25)


def drift(models, scale: dict[int, float] | None = None) -> None:
    """Each replica's inner steps, as a random move of its weights; ``scale[k]``: replica k inflates."""
    for k, m in enumerate(models):
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.01 * (scale or {}).get(k, 1.0) * torch.randn_like(p))


def sync_all(models, dilocos, audits, syncs: int, scale: dict[int, float] | None = None):
    async def run():
        wires: dict = {}
        boxes = [MemBox(p, wires) for p in PEERS]
        for step in range(2 * syncs):
            drift(models, scale)
            rnd = Round(1, step)
            await asyncio.gather(
                *(
                    outer_step(d, no_allreduce, stage_gather(b, PEERS, d, rnd, 5.0, Timing()), PEERS, a)  # type: ignore[arg-type]
                    for b, d, a in zip(boxes, dilocos, audits, strict=True)
                )
            )

    asyncio.run(run())


def test_the_trimmed_mean_is_the_sorted_middle_added_in_row_order():
    rows = torch.tensor([[1.0, 4.0], [2.0, 3.0], [100.0, -50.0], [3.0, 5.0]])
    mean, out = ordered_trimmed_mean(rows, 0.25)
    # row 2 is trimmed in every coordinate (an outlier); rows 0 and 3 in one of two (not)
    assert torch.equal(mean, torch.tensor([2.5, 3.5])) and out.tolist() == [False, False, True, False]
    two = torch.tensor([[1.0], [3.0]])
    assert torch.equal(ordered_trimmed_mean(two, 0.25)[0], torch.tensor([2.0]))  # nothing to trim
    with pytest.raises(ValueError, match="trimmed_mean"):
        OuterCodec("int2", rule="centered_clip")
    assert outer_codec(COMP, TRIMMED).rule == "trimmed_mean"  # type: ignore[union-attr]
    assert outer_codec(COMP).rule == "mean"  # type: ignore[union-attr]


def test_an_inflating_replica_is_trimmed_and_the_honest_replicas_stay_identical():
    models, dilocos = stage(4, trust=TRIMMED)
    before = [p.detach().clone() for p in models[0].parameters()]
    audits = [Audit() for _ in PEERS]
    sync_all(models, dilocos, audits, syncs=3, scale={3: 1e4})  # peer-d moves 10,000x as far
    ref = list(models[0].parameters())
    for m in models[1:3]:
        assert all(torch.equal(a, b) for a, b in zip(ref, m.parameters(), strict=True))
    moved = sum(float((a - b).detach().norm()) for a, b in zip(ref, before, strict=True))
    # under the plain mean the same run is dragged by peer-d's moves
    plain_models, plain = stage(4)
    sync_all(plain_models, plain, [Audit() for _ in PEERS], syncs=3, scale={3: 1e4})
    dragged = sum(
        float((a - b).detach().norm()) for a, b in zip(plain_models[0].parameters(), before, strict=True)
    )
    assert moved * 50 < dragged
    assert all(a.seen["peer-d"] == 3 for a in audits)
    # flagged when most of its coordinates were trimmed: the 2-bit codes round some of them to zero
    assert audits[0].clipped["peer-d"] >= 2
    assert all(a.clipped["peer-d"] > max(a.clipped[p] for p in PEERS[:3]) for a in audits), audits[0].clipped


def test_a_replica_sending_different_payloads_to_different_replicas_fails_the_sync():
    _models, dilocos = stage(3, trust=TRIMMED)
    members = PEERS[:3]

    async def run():
        wires: dict = {}
        boxes = [MemBox(p, wires) for p in members]
        rnd = Round(1, 1)
        round_no = rnd.at(Phase.OUTER).pack()
        true = dilocos[2].encode_outer()
        forged = [bytes([data[0] ^ 1]) + data[1:] for data in true]
        # peer-c sends its payload to peer-a, another one to peer-b, and echoes anything
        for target, parts in (("peer-a", true), ("peer-b", forged)):
            for i, data in enumerate(parts):
                await boxes[2].send(target, gather_tag(round_no, i), data)
            await boxes[2].send(target, make_tag(round_no, Stream.GATHER_ECHO), b"\0" * 96)
        syncs = []
        for k in (0, 1):
            d = dilocos[k]
            d.inner_done = 1
            gather = stage_gather(boxes[k], members, d, rnd, 2.0, Timing())  # type: ignore[arg-type]
            syncs.append(outer_step(d, no_allreduce, gather, members))
        return await asyncio.gather(*syncs, return_exceptions=True)

    results = asyncio.run(run())
    assert all(isinstance(r, CollectiveError) for r in results), results
    assert all("peer-c" in str(r) for r in results), results
    assert all(d.syncs == 0 for d in dilocos[:2])  # neither applied an outer step


def test_echo_passes_when_every_member_gathered_the_same_bytes():
    gathered = [[b"a1", b"a2"], [b"b1", b"b2"], [b"c1", b"c2"]]

    async def run():
        wires: dict = {}
        boxes = [MemBox(p, wires) for p in PEERS[:3]]
        return await asyncio.gather(*(echo(b, PEERS[:3], 77, gathered, 2.0) for b in boxes))  # type: ignore[arg-type]

    assert asyncio.run(run()) == [None, None, None]
    assert len(digests(gathered)) == 3 * 32 and digests(gathered) != digests(gathered[::-1])
