"""Sources without a network: this peer's own held state, and how wanted layers split over holders."""

import asyncio

import pytest
import torch

from potluck.model.stage import StageRunner
from potluck.peer.state.source import DiskSource, Holder, LocalSource, PeerSource, fetch_first
from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.jobspec import ModelSpec, OptimizerSpec
from potluck.transfer.errors import StateError
from potluck.transfer.manifest import StateWant
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
