"""The bottleneck's token side path (``model.bottleneck_tokens``, model/bottleneck.py): the cut starts
exact, the stages after a cut take the token ids and say so when they lack them, and every path that
runs a stage (pipeline, reference, spot-check replay, tick-tock layers, sampling, checkpoints) gives
the same function (the chained stages against the reference: ``test_bottleneck.py``)."""

import json

import pytest
import torch
from pydantic import ValidationError

from potluck.model.bottleneck import boundary_of, stage_holds
from potluck.model.layerwise import stage_layers
from potluck.model.sampling import generate
from potluck.model.stage import StageRunner
from potluck.model.transformer import StageModel
from potluck.protocol.jobspec import JobSpec, ModelSpec, OptimizerSpec
from potluck.transfer.snapshot import rename, select

BASE = {"n_layers": 4, "d_model": 32, "n_heads": 2, "vocab_size": 64, "seq_len": 16}
OPT = OptimizerSpec(lr=1e-2, warmup_steps=0)


def spec(rank: int = 4, side: bool = True) -> ModelSpec:
    return ModelSpec(**BASE, bottleneck_rank=rank, bottleneck_tokens=side)


def tokens(seed: int = 0, batch: int = 3) -> torch.Tensor:
    return torch.randint(0, 64, (batch, 17), generator=torch.Generator().manual_seed(seed))


def test_an_embedded_token_crosses_a_cut_exactly_at_init_and_mostly_not_without_the_side_path():
    x = tokens()[:, :-1]
    with torch.no_grad():
        side = StageModel(spec(4), 0, 4, 5, cuts=(2,))
        assert side.embed is not None
        h, cut = side.embed(x), side.boundary_at(2)
        torch.testing.assert_close(cut.decode(cut.encode(h), x), h, rtol=0, atol=1e-7)
        # the table is the first stage's embedding draw less the kept coordinates, on any stage
        assert cut.tokens is not None and not cut.tokens.weight[:, :4].any()
        torch.testing.assert_close(cut.tokens.weight[:, 4:], side.embed.weight[:, 4:], rtol=0, atol=0)
        far = StageModel(spec(4), 2, 4, 5).boundary_at(2).tokens
        assert far is not None and torch.equal(far.weight, cut.tokens.weight)
        # without the side path a rank-4 cut of d=32 keeps an eighth of each token's embedding
        plain = StageModel(spec(4, side=False), 0, 4, 5, cuts=(2,))
        assert plain.embed is not None
        hp, cp = plain.embed(x), plain.boundary_at(2)
        assert (cp.decode(cp.encode(hp)) - hp).norm() / hp.norm() > 0.8


def test_a_stage_after_a_cut_without_the_ids_fails_clearly():
    r = StageRunner(spec(4), 2, 4, 1, OPT)
    codes = torch.randn(2, 16, 4)
    with pytest.raises(ValueError, match="token ids"):
        r.forward(0, codes, tokens()[:2, 1:])
    assert not StageRunner(spec(4, side=False), 2, 4, 1, OPT).needs_tokens


def test_the_table_is_named_and_held_with_the_up_projection():
    s = spec(8)
    name = "model.boundaries.2.tokens.weight"
    old = [StageRunner(s, 0, 2, 1, OPT, cuts=(2,)), StageRunner(s, 2, 4, 1, OPT, cuts=(2,))]
    assert name in old[1].state_tensors() and name not in old[0].state_tensors()
    assert boundary_of(name) == (2, "up") and stage_holds(name, 2, 4) and not stage_holds(name, 0, 2)
    # a re-cut at 3 moves it into stage [0, 3) (test_bottleneck.py: the function is unchanged)
    held = rename(old[1].state_tensors(), 2)
    assert name in select(held, 0, 3, 4)


def test_replay_layers_and_sampling_take_the_ids():
    s = spec(8)
    r = StageRunner(s, 2, 4, 1, OPT)
    with torch.no_grad():
        r.model.boundary_at(2).tokens.weight.add_(0.1)  # type: ignore[union-attr]
    codes, batch = torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(1)), tokens(batch=2)
    r.forward(0, codes, batch[:, 1:], tokens=batch[:, :-1])
    want = r.backward(0)
    _, got = r.replay(r.frozen_copy(on_cpu=True), codes, batch[:, 1:], tokens=batch[:, :-1])
    assert got is not None and want is not None
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # the tick-tock executor's layers of a whole model with a position inside
    whole = StageRunner(s, 0, 4, 1, OPT, cuts=(2,))
    expected = float(whole.forward(0, batch[:, :-1], batch[:, 1:]))
    assert stage_layers(whole.model).run(batch[:, :-1], batch[:, 1:]) == pytest.approx(expected, abs=1e-6)
    # sampling chains the stages with the context's ids
    a, b = StageModel(s, 0, 2, 1), StageModel(s, 2, 4, 1)
    ids = generate([a, b], [1, 2, 3], 5, 0.0, None, 0)
    assert ids == generate([StageModel(s, 0, 4, 1, cuts=(2,))], [1, 2, 3], 5, 0.0, None, 0)


def test_spec_field_needs_a_rank_and_is_left_out_when_off():
    with pytest.raises(ValidationError, match="bottleneck_rank"):
        ModelSpec(**BASE, bottleneck_tokens=True)
    job = {
        "name": "j",
        "model": {**BASE, "bottleneck_rank": 8},
        "batch": {"tokens_per_step": 64, "micro_batch_size": 2},
    }
    ranked = JobSpec.model_validate(job)
    assert "bottleneck_tokens" not in json.dumps(ranked.model_dump(mode="json"))
    side = JobSpec.model_validate({**job, "model": {**job["model"], "bottleneck_tokens": True}})
    body = side.model_dump(mode="json")
    assert body["model"]["bottleneck_tokens"] is True and JobSpec.model_validate(body) == side
    assert side.canonical_bytes() != ranked.canonical_bytes()
