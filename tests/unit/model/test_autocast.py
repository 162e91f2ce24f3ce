"""bf16 autocast runs the CUDA code path on the CPU (``precision="bf16"``): the loss follows fp32
within bf16's tolerance, and master weights, gradients and AdamW state stay fp32."""

import pytest
import torch

from potluck.model.reference import reference_run
from potluck.model.stage import StageRunner
from potluck.protocol.jobspec import ModelSpec, OptimizerSpec
from potluck.testbed.harness.training import tiny_dataset, tiny_job

SPEC = ModelSpec(n_layers=2, d_model=32, n_heads=2, vocab_size=64, seq_len=16)


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, SPEC.vocab_size, (4, SPEC.seq_len + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def _runner(precision: str) -> StageRunner:
    return StageRunner(SPEC, 0, SPEC.n_layers, 7, OptimizerSpec(lr=1e-3), precision=precision)


def test_cpu_default_is_plain_fp32():
    assert _runner("auto").autocast is None
    assert _runner("fp32").autocast is None
    assert _runner("bf16").autocast is torch.bfloat16


def test_bf16_forward_matches_fp32_within_bf16_tolerance():
    x, y = _batch()
    full, half = _runner("fp32"), _runner("bf16")
    loss32 = float(full.forward(0, x, y))
    loss16 = float(half.forward(0, x, y))
    assert loss16 != loss32  # autocast really ran: bf16 matmuls round differently
    assert loss16 == pytest.approx(loss32, rel=2e-2)
    full.backward(0)
    half.backward(0)
    g32, g16 = full.grad_vector(), half.grad_vector()
    assert g16.dtype == torch.float32  # gradients land on the fp32 master weights
    cos = torch.nn.functional.cosine_similarity(g32, g16, dim=0)
    assert cos > 0.99


def test_master_weights_gradients_and_adamw_state_stay_fp32():
    half = _runner("bf16")
    x, y = _batch(1)
    for step in range(2):
        half.forward(0, x, y)
        half.backward(0)
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in half.params)
        half.step(1e-3)
        assert step >= 0
    assert all(p.dtype == torch.float32 for p in half.params)
    for p in half.params:
        state = half.optimizer.state[p]
        assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32
    saved = half.state_tensors()
    assert all(t.dtype == torch.float32 for k, t in saved.items() if k.startswith("model."))


def test_stage_outputs_crossing_the_wire_are_fp32_under_autocast():
    """Residual adds promote the bf16 matmul outputs back to fp32: what a stage sends on is fp32, so
    the codecs see the same dtype as from a CPU peer."""
    first = StageRunner(SPEC, 0, 1, 7, OptimizerSpec(), precision="bf16")
    out = first.forward(0, _batch()[0])
    assert out.dtype == torch.float32
    grad = first.backward(0, torch.ones_like(out))
    assert grad is None  # the first stage has no input gradient to send


def test_a_bf16_run_follows_the_fp32_loss_curve():
    job = tiny_job(steps=8)
    data = tiny_dataset(job)
    ref, _ = reference_run(job, data, n_replicas=2)
    runner = StageRunner(job.model, 0, job.model.n_layers, job.seed, job.optimizer, precision="bf16")
    got, trained = reference_run(job, data, n_replicas=2, runner=runner)
    assert got == pytest.approx(ref, rel=2e-2)
    assert got[-1] < got[0]  # it learns in bf16 too
    assert all(p.dtype == torch.float32 for p in trained.params)


def test_a_replay_on_a_cpu_copy_uses_the_stage_precision_for_that_device():
    """A GPU stage's spot-check replay runs on a CPU copy in fp32 (``auto``); a stage that asked for
    bf16 everywhere replays in bf16; either way the replay equals the live forward on the CPU."""
    x, _ = _batch(2)
    for precision in ("auto", "bf16"):
        runner = StageRunner(SPEC, 0, 1, 7, OptimizerSpec(), precision=precision)
        copy = runner.frozen_copy(on_cpu=True)
        live = runner.forward(0, x)
        out, _ = runner.replay(copy, x)
        assert out is not None and torch.equal(out, live)
    assert not torch.equal(
        StageRunner(SPEC, 0, 1, 7, OptimizerSpec(), precision="bf16").forward(0, x),
        StageRunner(SPEC, 0, 1, 7, OptimizerSpec(), precision="fp32").forward(0, x),
    )
