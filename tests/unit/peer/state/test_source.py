"""Sources without a network: this peer's own held state, and how wanted layers split over holders."""

import asyncio
from types import SimpleNamespace

import pytest
import torch

from potluck.model.stage import StageRunner
from potluck.peer.state.source import DiskSource, Holder, LocalSource, PeerSource, fetch_first
from potluck.peer.state.sources import start_sources
from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import ModelSpec, OptimizerSpec
from potluck.protocol.training import StageAssignment, StateHolder, TrainPlan
from potluck.transfer.errors import StateError
from potluck.transfer.manifest import StateWant
from potluck.transfer.server import StateServer, TransferConfig
from potluck.transfer.snapshot import StageState

MODEL = ModelSpec(n_layers=4, d_model=32, n_heads=2, vocab_size=256, seq_len=16)


def held(first: int, last: int, step: int = 4) -> StageState:
    runner = StageRunner(MODEL, first, last, seed=1, optimizer_spec=OptimizerSpec())
    meta = StageMeta(
        job="j", step=step, stage=0, n_stages=1, first_layer=first, last_layer=last, model=MODEL, seed=1,
        tokenizer=None, epoch=2,
    )  # fmt: skip
    return StageState(meta, runner.state_tensors())


def test_local_state_answers_a_sub_range_renamed_to_local_indices():
    state = held(0, 4)
    got = asyncio.run(LocalSource(state).fetch(StateWant("j", MODEL, 1, 4, 2, 4), 1.0))
    assert got.step == 4 and got.source == "local"
    assert torch.equal(got.tensors["model.layers.0.qkv.weight"], state.tensors["model.layers.2.qkv.weight"])
    assert "model.head.weight" in got.tensors and "model.embed.weight" not in got.tensors
    fresh = StageRunner(MODEL, 2, 4, seed=9, optimizer_spec=OptimizerSpec())
    fresh.load_state_tensors(got.tensors)  # strict: exactly the stage's weights


@pytest.mark.parametrize(
    "want",
    [StateWant("j", MODEL, 1, 5, 0, 2), StateWant("k", MODEL, 1, 4, 0, 2), StateWant("j", MODEL, 2, 4, 0, 2)],
)
def test_local_state_of_another_step_job_or_seed_is_refused(want):
    with pytest.raises(StateError, match="local"):
        asyncio.run(LocalSource(held(0, 4)).fetch(want, 1.0))


def test_fetch_first_reports_every_source_that_failed(tmp_path):
    sources = [LocalSource(None), DiskSource(tmp_path / "none")]
    with pytest.raises(StateError, match=r"no source.*holds no state.*disk:"):
        asyncio.run(fetch_first(sources, StateWant("j", MODEL, 1, 4, 0, 2), 1.0))


def test_wanted_layers_split_at_holder_boundaries():
    source = PeerSource(None, "s", [Holder("a", 0, 2), Holder("b", 2, 4), Holder("c", 0, 4)], None)  # type: ignore[arg-type]
    assert source.segments(1, 4) == [(1, 2, ["a", "c"]), (2, 4, ["b", "c"])]
    assert PeerSource(None, "s", [Holder("c", 0, 4)], None).segments(0, 4) == [(0, 4, ["c"])]  # type: ignore[arg-type]
    with pytest.raises(StateError, match=r"\[3, 4\)"):
        PeerSource(None, "s", [Holder("a", 0, 3)], None).segments(1, 4)  # type: ignore[arg-type]


def test_pieces_of_a_step_held_in_several_local_states_assemble_without_a_transfer():
    """Churn run X: a peer that moved from layer 3 to layers 0-2 at step 736 still offers both; a plan
    that re-cuts the layers to [0, 4) takes them from its memory, no holder dialled."""
    pieces = [held(0, 3, step=736), held(3, 4, step=736), held(0, 4, step=816)]
    source = PeerSource(None, "s", [], TransferConfig(), local=pieces)  # type: ignore[arg-type]  # no stream
    fetched = asyncio.run(source.fetch(StateWant("j", MODEL, 1, 736, 0, 4), 5.0))
    assert not fetched.owned  # pieces of this peer's held state: copied into a stage, never taken
    got = fetched.tensors
    local3 = pieces[1].tensors["model.layers.0.qkv.weight"]  # layer 3 is its stage's first
    assert torch.equal(got["model.layers.3.qkv.weight"], local3)
    assert torch.equal(got["model.layers.0.qkv.weight"], pieces[0].tensors["model.layers.0.qkv.weight"])


def test_a_plan_s_named_holders_are_asked_besides_the_recent_plans_peers(tmp_path):
    """``TrainPlan.holders``: the coordinator names a peer holding layers 2-4 that no recent plan placed
    there; ``start_sources`` asks it for them."""
    me = Identity.generate()
    b, c = (Identity.generate().peer_id for _ in range(2))
    stages = [StageAssignment(first_layer=0, last_layer=2, peers=[me.peer_id])]
    stages.append(StageAssignment(first_layer=2, last_layer=4, peers=[b]))
    plan = TrainPlan(
        job="j", epoch=5, start_step=736, micro_batches=1, issued_at=1.0, stages=stages,
        holders=[StateHolder(peer_id=c, first_layer=2, last_layer=4)],
    )  # fmt: skip
    server = StateServer(SimpleNamespace(peer_id=me.peer_id), "s", me, TransferConfig())  # type: ignore[arg-type]
    sources = start_sources(plan, [plan], tmp_path, server, None, "s", me.peer_id, None)  # type: ignore[arg-type]
    live = [s for s in sources if isinstance(s, PeerSource) and s.cfg.settle_s > 0]
    assert len(live) == 1 and {(h.peer_id, h.first, h.last) for h in live[0].holders} == {
        (b, 2, 4),
        (c, 2, 4),
    }
