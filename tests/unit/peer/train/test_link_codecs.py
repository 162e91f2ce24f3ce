"""A peer codes each pipeline link with the chain its plan names for it (``TrainPlan.link_codecs``): the
payloads on the wire carry that chain in their self-describing headers, the step runs through, and a
receiver that expects another chain refuses the payload (decoding is strict) instead of misreading it."""

import asyncio

import pytest

from potluck.compression import get_codec
from potluck.compression.errors import CompressionError
from potluck.compression.wire import unpack_header
from potluck.model.stage import StageRunner
from potluck.net.tags import INDEX_BITS, Round, Stream
from potluck.peer.errors import NeighbourError
from potluck.peer.train.pipeline import Neighbours, PipeCodecs, Timing, link_codecs, pipeline_step
from potluck.protocol.identity import Identity
from potluck.protocol.training import LinkCodecs, StageAssignment, TrainPlan
from potluck.testbed.harness.training import tiny_job
from tests.unit.peer.train.test_pipeline_staging import MemBox, _micro

PEERS = [Identity.generate().peer_id for _ in range(3)]
FWD, BACK, JOB_CHAIN = "int4:block=32|zstd", "bf16", "int8:block=64"


def rows(forward: list[str], backward: list[str]) -> LinkCodecs:
    """Link codecs of a one-replica plan from each boundary's forward and backward chain."""
    chains = sorted(set(forward) | set(backward))
    return LinkCodecs(
        chains=chains,
        forward=[[chains.index(c)] for c in forward],
        backward=[[chains.index(c)] for c in backward],
    )


def plan(links: LinkCodecs | None, n_stages: int = 2) -> TrainPlan:
    stages = [StageAssignment(first_layer=j, last_layer=j + 1, peers=[PEERS[j]]) for j in range(n_stages)]
    return TrainPlan(
        job="t", epoch=1, start_step=0, stages=stages, micro_batches=1, link_codecs=links, issued_at=1.0
    )


def test_each_position_gets_its_links_chains_by_direction():
    p = plan(rows([FWD, "none"], [BACK, "fp16"]), 3)
    first, middle, last = (link_codecs(p, j, 0, JOB_CHAIN) for j in range(3))
    assert (first.acts_out.spec, first.grads_in.spec) == (FWD, BACK)
    assert (middle.acts_in.spec, middle.grads_out.spec) == (FWD, BACK)  # its link to stage 0
    assert (middle.acts_out.spec, middle.grads_in.spec) == ("none", "fp16")  # its link to stage 2
    assert (last.acts_in.spec, last.grads_out.spec) == ("none", "fp16")
    # without per-link chains every link uses the job's
    plain = link_codecs(plan(None, 3), 1, 0, JOB_CHAIN)
    assert {c.spec for c in (plain.acts_in, plain.acts_out, plain.grads_in, plain.grads_out)} == {
        get_codec(JOB_CHAIN).spec
    }


def test_a_chain_the_peer_cannot_build_fails_before_any_step():
    with pytest.raises(CompressionError, match=r"int9|unknown"):
        link_codecs(plan(rows(["int9"], [BACK])), 0, 0, JOB_CHAIN)


async def _two_stages(codecs: tuple[PipeCodecs, PipeCodecs], wires: dict) -> list[float]:
    job = tiny_job()
    runners = [
        StageRunner(job.model, 0, 2, job.seed, job.optimizer),
        StageRunner(job.model, 2, 4, job.seed, job.optimizer),
    ]
    boxes = [MemBox("a", wires), MemBox("b", wires)]
    wheres = [Neighbours(0, 2, None, "b"), Neighbours(1, 2, "a", None)]
    return list(
        await asyncio.gather(
            *(
                pipeline_step(box, r, w, _micro(job, r.is_first, r.is_last), Round(1, 0), c, 30.0, Timing())
                for box, r, w, c in zip(boxes, runners, wheres, codecs, strict=True)
            )
        )
    )


def test_the_pipeline_sends_each_direction_with_its_plans_chain():
    p = plan(rows([FWD], [BACK]))
    wires: dict = {}
    losses = asyncio.run(
        _two_stages((link_codecs(p, 0, 0, JOB_CHAIN), link_codecs(p, 1, 0, JOB_CHAIN)), wires)
    )
    assert losses[1] > 0
    # every message's (sender, stream kind) -> the chain in its header
    seen = {
        (src, Stream(tag.stream >> INDEX_BITS)): unpack_header(fut.result()[0])[0].spec
        for (src, _, tag), fut in wires.items()
    }
    assert seen == {("a", Stream.ACTIVATIONS): FWD, ("b", Stream.ACTIVATION_GRADS): BACK}


def test_a_receiver_expecting_another_chain_refuses_the_payload():
    sender = link_codecs(plan(rows([FWD], [BACK])), 0, 0, JOB_CHAIN)
    stale = PipeCodecs.same(get_codec(JOB_CHAIN))  # a peer still on the job's chain for this link
    with pytest.raises(NeighbourError, match="undecodable"):
        asyncio.run(_two_stages((sender, stale), {}))
