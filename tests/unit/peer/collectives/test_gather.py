"""The coded outer sync's all-gather over the mailbox: order, bounds, missing and foreign payloads, and
replicas that stay bit-identical through the job's DiLoCo (``peer/train/outer.py``)."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from potluck.compression import get_codec
from potluck.net.tags import Round, Tag
from potluck.peer.collectives.gather import allgather, gather_tag, payload_bound
from potluck.peer.errors import CollectiveError, ContributionError
from potluck.peer.train.outer import make_diloco, outer_config, outer_step, part_bounds, stage_gather
from potluck.peer.train.pipeline import Timing
from potluck.protocol.errors import WireError
from potluck.protocol.jobspec import CompressionSpec, TrustSpec

PEERS = ["peer-a", "peer-b", "peer-c"]
ROUND = Round(1, 7, 1).pack()


class MemBox:
    """Just what the all-gather uses of a Mailbox: send (quietly too) and recv by (sender, receiver, tag)."""

    def __init__(self, me: str, wires: dict[tuple[str, str, Tag], asyncio.Future[bytes]]) -> None:
        self.peer_id, self.wires = me, wires
        self.bytes_sent = 0

    def _wire(self, src: str, dst: str, tag: Tag) -> asyncio.Future[bytes]:
        return self.wires.setdefault((src, dst, tag), asyncio.get_running_loop().create_future())

    async def send(self, peer: str, tag: Tag, payload: bytes) -> None:
        self.bytes_sent += len(payload)
        self._wire(self.peer_id, peer, tag).set_result(payload)

    async def recv(self, peer: str, tag: Tag, timeout_s: float | None = None) -> bytes:
        try:
            return await asyncio.wait_for(asyncio.shield(self._wire(peer, self.peer_id, tag)), timeout_s)
        except TimeoutError:  # as the mailbox says it
            raise WireError(f"no message {tag} from {peer} within {timeout_s} s") from None

    async def send_quietly(self, peer: str, tag: Tag, payload: bytes) -> str | None:
        try:  # the mailbox's: a failure's reason instead of an error
            await self.send(peer, tag, payload)
        except WireError as e:
            return str(e)
        return None


def gather_all(payloads, bounds, timeout_s=5.0, members=PEERS, extra=None):
    """Run the all-gather on every member; ``extra(wires)`` may plant messages first."""

    async def run():
        wires: dict = {}
        if extra is not None:
            extra(wires)
        boxes = [MemBox(p, wires) for p in members]
        return await asyncio.gather(
            *(allgather(b, members, ROUND, payloads[b.peer_id], bounds, timeout_s) for b in boxes),  # type: ignore[arg-type]
            return_exceptions=True,
        )

    return asyncio.run(run())


def test_every_member_gets_every_payload_in_the_groups_order():
    payloads = {p: [p.encode() * 3, p.encode()] for p in PEERS}
    results = gather_all(payloads, [100, 100])
    want = [payloads[p] for p in PEERS]
    assert results == [want, want, want]


def test_a_payload_over_its_bound_is_refused_naming_its_sender():
    payloads = {p: [b"x" * 10] for p in PEERS}
    payloads["peer-b"] = [b"x" * 11]  # a forger ignores its own bound check; modelled by a larger bound
    results = gather_all(payloads, [10], timeout_s=0.3)
    assert isinstance(results[1], CollectiveError)  # peer-b's own check: over its bound, it never sends
    for r in (results[0], results[2]):
        assert isinstance(r, CollectiveError)  # nothing from peer-b: the others wait it out, or refuse


def test_an_oversized_payload_that_arrives_is_refused_before_decoding():
    async def run():
        wires: dict = {}
        box = MemBox("peer-a", wires)
        forger = MemBox("peer-b", wires)
        await forger.send("peer-a", gather_tag(ROUND, 0), b"y" * 50)  # bypasses the sender's check
        return await allgather(box, ["peer-a", "peer-b"], ROUND, [b"x" * 10], [10], 5.0)  # type: ignore[arg-type]

    with pytest.raises(ContributionError, match="over its 10-byte bound") as err:
        asyncio.run(run())
    assert err.value.peer == "peer-b"


def test_a_missing_payload_fails_the_gather_within_its_timeout():
    async def run():
        wires: dict = {}
        boxes = [MemBox(p, wires) for p in PEERS[:2]]  # peer-c never sends
        return await asyncio.gather(
            *(allgather(b, PEERS, ROUND, [b"p"], [8], 0.2) for b in boxes),  # type: ignore[arg-type]
            return_exceptions=True,
        )

    results = asyncio.run(run())
    for r in results:
        assert isinstance(r, CollectiveError) and "peer-c" in str(r)


def test_a_non_member_s_message_is_never_taken():
    def plant(wires):  # an outsider sends under the gather's own tag to every member
        loop = asyncio.get_running_loop()
        for p in PEERS[:2]:
            fut = loop.create_future()
            fut.set_result(b"forged")
            wires[("outsider", p, gather_tag(ROUND, 0))] = fut

    payloads = {p: [p.encode()] for p in PEERS[:2]}
    results = gather_all(payloads, [64], members=PEERS[:2], extra=plant)
    assert results[0] == results[1] == [[b"peer-a"], [b"peer-b"]]
    with pytest.raises(CollectiveError, match="not in this all-gather group"):
        asyncio.run(allgather(MemBox("outsider", {}), PEERS, ROUND, [b""], [8], 1.0))  # type: ignore[arg-type]


def test_the_bound_holds_what_honest_encoders_produce():
    for spec in ("int2:block=512|zstd", "topk:density=0.03,method=chunk|int2|zstd", "none"):
        codec = get_codec(spec)
        for n in (1, 1000, 65_537):
            x = torch.randn(n) * 1e3  # incompressible-ish values
            assert len(codec.encode(x, key=(0, 0))) <= payload_bound(codec, n), (spec, n)


COMP = CompressionSpec(sync_every=2, outer="int2:block=64|zstd")


def stage(n: int, comp: CompressionSpec = COMP, trust: TrustSpec | None = None):
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.Linear(30, 5))
    models = [copy.deepcopy(base) for _ in range(n)]
    return models, [make_diloco(list(m.parameters()), comp, trust) for m in models]


async def no_allreduce(_t: torch.Tensor) -> torch.Tensor:
    raise AssertionError("a coded outer sync never all-reduces")


def test_replicas_stay_bit_identical_through_the_jobs_coded_outer_sync():
    models, dilocos = stage(3)

    async def run():
        wires: dict = {}
        boxes = [MemBox(p, wires) for p in PEERS]
        for step in range(4):
            for k, m in enumerate(models):  # each replica drifts its own way
                with torch.no_grad():
                    for p in m.parameters():
                        p.add_(0.01 * (k + 1) * torch.randn_like(p))
            rnd = Round(1, step)
            await asyncio.gather(
                *(
                    outer_step(d, no_allreduce, stage_gather(b, PEERS, d, rnd, 5.0, Timing()), PEERS)  # type: ignore[arg-type]
                    for b, d in zip(boxes, dilocos, strict=True)
                )
            )
        return boxes

    boxes = asyncio.run(run())
    assert all(d.syncs == 2 for d in dilocos)
    ref = list(models[0].parameters())
    for m in models[1:]:
        assert all(torch.equal(a, b) for a, b in zip(ref, m.parameters(), strict=True))
    numel = sum(p.numel() for p in ref)
    per_sync = boxes[0].bytes_sent / 2 / (len(PEERS) - 1)  # one copy per other replica per sync
    assert per_sync < 4 * numel / 8  # 2-bit codes: over 8x fewer bytes than fp32


def test_a_stage_down_to_one_replica_syncs_alone():
    """A plan shrunk under churn to one replica keeps the job's coded outer sync: the gather is the
    replica's own payloads and the outer step is applied (it raised "Set of Tasks/Futures is empty"
    at every sync, and the job never got past it)."""
    assert gather_all({"peer-a": [b"x", b"yy"]}, [10, 10], members=["peer-a"]) == [[[b"x", b"yy"]]]
    models, dilocos = stage(1)
    before = [p.detach().clone() for p in models[0].parameters()]

    async def run() -> MemBox:
        box = MemBox("peer-a", {})
        for step in range(2):
            with torch.no_grad():
                for p in models[0].parameters():
                    p.add_(0.01 * torch.randn_like(p))
            gather = stage_gather(box, ["peer-a"], dilocos[0], Round(1, step), 5.0, Timing())  # type: ignore[arg-type]
            await outer_step(dilocos[0], no_allreduce, gather, ["peer-a"])
        return box

    box = asyncio.run(run())
    assert dilocos[0].syncs == 1 and box.bytes_sent == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, models[0].parameters(), strict=True))


def test_an_undecodable_payload_fails_the_sync_naming_its_peer():
    _models, dilocos = stage(2)
    foreign = get_codec("int8:block=64")  # the right size, the wrong codec

    async def run():
        wires: dict = {}
        boxes = [MemBox(p, wires) for p in PEERS[:2]]
        bounds = part_bounds(dilocos[0])
        forged = [foreign.encode(torch.zeros(n)) for _o, n in dilocos[1].parts]
        assert all(len(f) <= b for f, b in zip(forged, bounds, strict=True))
        for i, data in enumerate(forged):  # peer-b sends the forged parts, and does no sync itself
            await boxes[1].send("peer-a", gather_tag(Round(1, 1).at(1).pack(), i), data)
        d = dilocos[0]
        d.inner_done = 1
        gather = stage_gather(boxes[0], PEERS[:2], d, Round(1, 1), 5.0, Timing())  # type: ignore[arg-type]
        await outer_step(d, no_allreduce, gather, PEERS[:2])

    with pytest.raises(ContributionError) as err:
        asyncio.run(run())
    assert err.value.peer == "peer-b"


def test_the_decaying_residual_replaces_the_outer_momentum():
    assert outer_config(COMP).outer_momentum > 0
    decayed = CompressionSpec(sync_every=4, outer="int2", outer_ef_decay=0.9)
    assert outer_config(decayed).outer_momentum == 0 and outer_config(decayed).inner_steps == 4
    _models, dilocos = stage(1, decayed)
    assert dilocos[0].outer_codec is not None and dilocos[0].outer_codec.ef_decay == 0.9
    _models, plain = stage(1, CompressionSpec(sync_every=4))
    assert (
        plain[0].outer_codec is None and stage_gather(None, [], plain[0], Round(1, 0), 1.0, Timing()) is None
    )  # type: ignore[arg-type]
