"""The learned low-rank bottleneck at stage cuts (model/bottleneck.py): exactness at full rank, shapes
on the wire, the reference equals the chained stages, names, checkpoints and the job spec field."""

import json

import pytest
import torch
from pydantic import ValidationError

from potluck.model.bottleneck import Boundary, boundary_of, check_cuts, stage_holds
from potluck.model.checkpoint import CheckpointRef, save_stage
from potluck.model.optim import clip_coefficient
from potluck.model.reference import parameters_by_global_name
from potluck.model.resume import load_layers
from potluck.model.sampling import load_model
from potluck.model.stage import StageRunner
from potluck.model.transformer import StageModel
from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.jobspec import JobSpec, ModelSpec, OptimizerSpec
from potluck.transfer.snapshot import rename, select

BASE = {"n_layers": 4, "d_model": 32, "n_heads": 2, "vocab_size": 64, "seq_len": 16}
SPEC = ModelSpec(**BASE)
OPT = OptimizerSpec(lr=1e-2, warmup_steps=0)


def spec(rank: int | None) -> ModelSpec:
    return ModelSpec(**BASE, bottleneck_rank=rank)


def tokens(seed: int = 0, batch: int = 3) -> torch.Tensor:
    return torch.randint(0, 64, (batch, SPEC.seq_len + 1), generator=torch.Generator().manual_seed(seed))


def run_pipeline(runners: list[StageRunner], batch: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    """One micro-batch forward and backward through chained runners, as the pipeline moves it; returns
    the loss and what crossed each cut forward. A stage that re-embeds the ids at a bottleneck
    (``model.bottleneck_tokens``) gets them from its own copy of the data, as a peer does."""
    ids = batch[:, :-1]
    x, sent = ids, []
    for r in runners[:-1]:
        x = r.forward(0, x, tokens=ids if r.needs_tokens else None)
        sent.append(x)
    loss = float(runners[-1].forward(0, x, batch[:, 1:], tokens=ids if runners[-1].needs_tokens else None))
    grad = runners[-1].backward(0)
    for r in reversed(runners[:-1]):
        grad = r.backward(0, grad)
    return loss, sent


def test_full_rank_identity_equals_no_bottleneck_forward_and_backward():
    batch = tokens()
    plain = [StageRunner(SPEC, 0, 2, 5, OPT), StageRunner(SPEC, 2, 4, 5, OPT)]
    full = [StageRunner(spec(32), 0, 2, 5, OPT), StageRunner(spec(32), 2, 4, 5, OPT)]
    loss_a, sent_a = run_pipeline(plain, batch)
    loss_b, sent_b = run_pipeline(full, batch)
    assert loss_a == loss_b
    torch.testing.assert_close(sent_a[0], sent_b[0], rtol=0, atol=0)
    for a, b in zip(plain, full, strict=True):
        grads = dict(zip(b.names, b.params, strict=True))
        for name, p in zip(a.names, a.params, strict=True):
            assert p.grad is not None
            torch.testing.assert_close(p.grad, grads[name].grad, rtol=0, atol=0)
    assert {n for r in full for n in r.names} - {n for r in plain for n in r.names} == {
        "boundaries.2.down.weight",
        "boundaries.2.up.weight",
    }


def test_low_rank_sends_rank_numbers_per_token_both_ways():
    runners = [StageRunner(spec(4), 0, 1, 5, OPT), StageRunner(spec(4), 1, 3, 5, OPT)]
    runners.append(StageRunner(spec(4), 3, 4, 5, OPT))
    batch = tokens(batch=2)
    x = runners[0].forward(0, batch[:, :-1])
    assert x.shape == (2, 16, 4)
    y = runners[1].forward(0, x)
    assert y.shape == (2, 16, 4)
    runners[2].forward(0, y, batch[:, 1:])
    g = runners[1].backward(0, runners[2].backward(0))
    assert g is not None and g.shape == (2, 16, 4)
    assert spec(4).boundary_width == 4 and SPEC.boundary_width == 32
    # the maps get gradients and are stepped like any weight
    down = dict(zip(runners[0].names, runners[0].params, strict=True))["boundaries.1.down.weight"]
    runners[0].backward(0, g)
    assert down.grad is not None and down.grad.abs().sum() > 0
    before = down.detach().clone()
    runners[0].step(1e-2)
    assert not torch.equal(before, down.detach())


@pytest.mark.parametrize("side", [False, True], ids=["maps", "token-side-path"])
def test_reference_with_cuts_equals_the_chained_stages_through_training(side):
    s = ModelSpec(**BASE, bottleneck_rank=8, bottleneck_tokens=side)
    ref = StageRunner(s, 0, 4, 3, OPT, cuts=(1, 3))
    stages = [StageRunner(s, 0, 1, 3, OPT), StageRunner(s, 1, 3, 3, OPT), StageRunner(s, 3, 4, 3, OPT)]
    assert [r.needs_tokens for r in stages] == [False, side, side] and not ref.needs_tokens
    for step in range(3):
        batch = tokens(step)
        loss, _ = run_pipeline(stages, batch)
        ref_loss = float(ref.forward(0, batch[:, :-1], batch[:, 1:]))
        ref.backward(0)
        assert abs(loss - ref_loss) < 1e-5
        norm = sum(r.grad_sq_norm() for r in stages) ** 0.5
        for r in stages:
            r.step(1e-2, clip_coefficient(OPT, norm))
        ref.step(1e-2, clip_coefficient(OPT, ref.grad_sq_norm() ** 0.5))
    merged = {k: v for r in stages for k, v in parameters_by_global_name(r).items()}
    want = parameters_by_global_name(ref)
    assert merged.keys() == want.keys()
    assert ({"boundaries.1.tokens.weight", "boundaries.3.tokens.weight"} <= want.keys()) == side
    for k, v in want.items():
        torch.testing.assert_close(merged[k], v, rtol=1e-4, atol=1e-5)
    if side:  # the tables learn: they moved from their init
        init = StageModel(s, 3, 4, 3).boundary_at(3).tokens
        assert init is not None and not torch.equal(want["boundaries.3.tokens.weight"], init.weight)


def test_a_whole_model_without_cuts_has_no_bottleneck():
    assert not StageModel(spec(8), 0, 4, 0).boundaries
    with pytest.raises(ValueError, match="inside"):
        StageModel(spec(8), 0, 4, 0, cuts=(4,))
    assert check_cuts([3, 1, 3], 4) == (1, 3)
    with pytest.raises(ValueError, match="rank"):
        Boundary(8, 9, down=True, up=True)


def test_names_are_global_and_the_stages_on_either_side_hold_them():
    assert boundary_of("model.boundaries.12.down.weight") == (12, "down")
    assert boundary_of("optim.boundaries.3.up.weight.exp_avg") == (3, "up")
    assert boundary_of("model.layers.0.qkv.weight") is None
    assert stage_holds("model.boundaries.2.down.weight", 0, 2)
    assert not stage_holds("model.boundaries.2.down.weight", 2, 4)
    assert stage_holds("model.boundaries.2.up.weight", 2, 4)
    assert stage_holds("model.boundaries.2.up.weight", 0, 4)  # a position inside the range
    assert stage_holds("model.boundaries.2.down.weight", 0, 4)
    assert not stage_holds("model.boundaries.2.up.weight", 0, 2)
    assert not stage_holds("model.embed.weight", 0, 4)


def test_state_round_trip_and_a_moved_cut_starts_from_the_identity():
    s = spec(8)
    a = StageRunner(s, 0, 2, 1, OPT)
    run_pipeline([a, StageRunner(s, 2, 4, 1, OPT)], tokens())
    a.step(1e-2)
    saved = a.state_tensors()
    assert "model.boundaries.2.down.weight" in saved and "optim.boundaries.2.down.weight.exp_avg" in saved
    b = StageRunner(s, 0, 2, 1, OPT)
    b.load_state_tensors(saved)
    for k, v in b.state_tensors().items():
        torch.testing.assert_close(v, saved[k], rtol=0, atol=0)
    # saved without the map (a cut that moved, or a job that had no bottleneck): identity init
    c = StageRunner(s, 0, 2, 1, OPT)
    c.load_state_tensors({k: v for k, v in saved.items() if boundary_of(k) is None})
    torch.testing.assert_close(c.model.boundaries["2"].down.weight, torch.eye(8, 32), rtol=0, atol=0)
    # a job without a bottleneck loads the checkpoint of one without the maps, and refuses extra ones
    plain = StageRunner(SPEC, 0, 2, 1, OPT)
    plain.load_state_tensors({k: v for k, v in saved.items() if boundary_of(k) is None})
    with pytest.raises(RuntimeError, match="boundaries"):
        StageRunner(SPEC, 0, 2, 1, OPT).load_state_tensors(saved)


def test_spec_field_is_validated_and_left_out_at_its_default():
    with pytest.raises(ValidationError, match="at most d_model"):
        spec(33)
    with pytest.raises(ValidationError):
        spec(0)
    job = {"name": "j", "model": BASE, "batch": {"tokens_per_step": 64, "micro_batch_size": 2}}
    plain = JobSpec.model_validate(job)
    assert "bottleneck_rank" not in json.dumps(plain.model_dump(mode="json"))
    ranked = JobSpec.model_validate({**job, "model": {**BASE, "bottleneck_rank": 8}})
    body = ranked.model_dump(mode="json")
    assert body["model"]["bottleneck_rank"] == 8
    assert JobSpec.model_validate(body) == ranked
    assert plain.canonical_bytes() != ranked.canonical_bytes()


def test_checkpoint_holds_the_maps_and_loads_for_sampling_resume_and_transfer(tmp_path):
    s = spec(8)
    stages = [StageRunner(s, 0, 2, 1, OPT), StageRunner(s, 2, 4, 1, OPT)]
    run_pipeline(stages, tokens())
    for r in stages:
        r.step(1e-2)
    for j, r in enumerate(stages):
        meta = StageMeta(
            job="b",
            step=1,
            stage=j,
            n_stages=2,
            first_layer=r.first,
            last_layer=r.last,
            model=s,
            seed=1,
            tokenizer=None,
            epoch=1,
        )
        save_stage(tmp_path, r.state_tensors(), meta)
    # sampling chains the saved stages, maps included (strict load), and computes what they compute
    models, loaded_spec, _ = load_model(CheckpointRef(tmp_path, 1, 2))
    assert loaded_spec.bottleneck_rank == 8
    x = tokens()[:, :-1]
    with torch.no_grad():
        want = stages[1].model(stages[0].model(x))
        torch.testing.assert_close(models[1](models[0](x)), want, rtol=0, atol=0)
    # resume: each side of the cut gets its map back
    first = load_layers(tmp_path, 1, 0, 2, 4)
    assert "model.boundaries.2.down.weight" in first and "model.boundaries.2.up.weight" not in first
    assert "model.boundaries.2.up.weight" in load_layers(tmp_path, 1, 2, 4, 4)
    # state transfer: a range ending at the cut takes the down map, a range not at it takes neither
    held = rename(stages[0].state_tensors(), 0)
    assert "model.boundaries.2.down.weight" in select(held, 0, 2, 4)
    assert not [k for k in select(held, 0, 1, 4) if boundary_of(k)]


def test_a_spot_check_replay_on_a_frozen_copy_reproduces_the_stage():
    r = StageRunner(spec(8), 2, 4, 1, OPT)
    with torch.no_grad():
        r.model.boundaries["2"].up.weight.add_(0.1)  # trained away from the init: the copy must carry it
    codes, y = torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(1)), tokens(batch=2)[:, 1:]
    r.forward(0, codes, y)
    want = r.backward(0)
    _, got = r.replay(r.frozen_copy(on_cpu=True), codes, y)
    assert got is not None and want is not None and got.shape == (2, 16, 8)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("side", [False, True], ids=["maps", "token-side-path"])
def test_a_moved_cut_keeps_the_positions_and_their_learned_maps(side):
    """Positions fixed at {2}: the pipeline re-cut at 3 (its state moved by ``select`` as a transfer
    moves it) computes exactly what the one cut at 2 computed; stage [3, 4) receives full-width hidden
    states, stage [0, 3) applies U D at 2 in place (with the side path, its token table too)."""
    s = ModelSpec(**BASE, bottleneck_rank=8, bottleneck_tokens=side)
    old = [StageRunner(s, 0, 2, 1, OPT, cuts=(2,)), StageRunner(s, 2, 4, 1, OPT, cuts=(2,))]
    for step in range(2):
        run_pipeline(old, tokens(step))
        for r in old:
            r.step(1e-2)
    held = {**rename(old[0].state_tensors(), 0), **rename(old[1].state_tensors(), 2)}
    new = [StageRunner(s, 0, 3, 1, OPT, cuts=(2,)), StageRunner(s, 3, 4, 1, OPT, cuts=(2,))]
    for r in new:
        r.load_state_tensors(rename(select(held, r.first, r.last, 4), -r.first))
    assert (new[0].model.width_out, new[1].model.width_in) == (32, 32)
    assert new[0].model.cuts == (2,) and not new[1].model.boundaries
    assert [r.needs_tokens for r in (*old, *new)] == [False, side, False, False]
    x = tokens(7)[:, :-1]
    with torch.no_grad():
        want = old[1].model(old[0].model(x), x)
        torch.testing.assert_close(new[1].model(new[0].model(x)), want, rtol=0, atol=0)
        # the learned maps, not a fresh identity: the old cut's down-projection moved
        assert not torch.equal(new[0].model.boundaries["2"].down.weight, torch.eye(8, 32))
    # the one-stage reference with the same positions is the same function
    whole = StageRunner(s, 0, 4, 1, OPT, cuts=(2,))
    whole.load_state_tensors(select(held, 0, 4, 4))
    with torch.no_grad():
        torch.testing.assert_close(whole.model(x), want, rtol=1e-6, atol=1e-6)
