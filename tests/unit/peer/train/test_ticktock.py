"""Tick-tock execution: admission, the accounted budget (W2), the inter-wave rule (W3), end to end."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from potluck.model.layerwise import Layerwise, stage_layers
from potluck.model.memprofile import MemoryProfile, measure_profile, offset_of
from potluck.model.stage import StageRunner
from potluck.peer.errors import ColocationRefused
from potluck.peer.train.ticktock import TickTock, activation_budget, admit, merge_gradients
from potluck.protocol.jobspec import ModelSpec, OptimizerSpec
from potluck.testbed.harness.ticktock import (
    TINY,
    init_mlp,
    max_err,
    numpy_sim,
    regression_data,
    separate_replicas,
    ticktock_replicas,
    token_batches,
    torch_sync_dp,
    torch_ticktock,
)

SPEC = ModelSpec(n_layers=4, d_model=64, n_heads=4, vocab_size=64, seq_len=64)


@pytest.fixture(autouse=True, scope="module")
def single_threaded() -> Iterator[None]:
    """Each wave is one thread of single-threaded ops (two intra-op pools would fight for 2 cores and
    turn a 7 ms profile into hundreds of ms of scheduling noise)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def replicas(single_threaded: None) -> tuple[list[StageRunner], object]:
    torch.manual_seed(0)
    reps = [StageRunner(SPEC, 0, 4, 0, OptimizerSpec()) for _ in range(2)]
    x = torch.randint(0, 64, (4, 65), generator=torch.Generator().manual_seed(0))
    profile = measure_profile(stage_layers(reps[0].model), lambda: (x[:, :-1], x[:, 1:]), reps[0].params, 3)
    for r in reps:
        r.zero_grad()
    return reps, profile


def _budget(profile: MemoryProfile) -> float:
    """1.4x one wave's peak (W2), or the staggered peak where a profile measured on a loaded machine
    puts it higher (its forward:backward ratio skewed by other processes): the rules under test are the
    same at any budget that admits the pair and refuses a simultaneous start."""
    best = offset_of(profile)
    assert best.ratio < 1.9, f"no stagger helps this profile: {best}"
    return max(1.4 * profile.peak_bytes, best.combined_peak)


def _batches(n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(0, 64, (4, 65), generator=g)
        out.append((x[:, :-1], x[:, 1:], 1.0 / (2 * n)))
    return out


def test_a_simultaneous_start_is_refused_and_d_star_admitted(replicas) -> None:
    _, profile = replicas
    budget = _budget(profile)
    with pytest.raises(ColocationRefused, match="over the budget"):
        admit(profile, budget, offset_s=0.0)
    o = admit(profile, budget)
    assert o.combined_peak <= budget and o.offset_s > 0
    with pytest.raises(ColocationRefused):
        TickTock([stage_layers(r.model) for r in replicas[0]], profile, 0.9 * profile.peak_bytes)
    assert activation_budget(10_000, 4_000) == 6_000 and activation_budget(1, 2) == 0


class _Paced(torch.autograd.Function):
    """Sleeps SLOW_S in each layer's forward and twice that in its backward: the waves' timing is then
    set by the sleeps (no CPU), not by whatever else the machine runs, and forward:backward is 1:2."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        time.sleep(SLOW_S)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        time.sleep(2 * SLOW_S)
        return grad


SLOW_S = 0.01  # seconds of sleep per layer forward


def _paced(runner: StageRunner) -> Layerwise:
    lw = stage_layers(runner.model)
    lw.layers = [lambda x, f=f: _Paced.apply(f(x)) for f in lw.layers]
    return lw


def test_two_waves_stay_within_the_accounted_budget(replicas) -> None:
    reps, _ = replicas
    x = torch.randint(0, 64, (4, 65), generator=torch.Generator().manual_seed(0))
    # The budget holds in every step. That the waves overlap at all depends on the threads being
    # scheduled and on the profile: one measured while other tests load the box can have its unpaced ops
    # (embedding, head, loss) stretched until the only stagger it admits starts a wave in the other's
    # last backward (a CI run saw three steps with no overlap at all). So the overlap gets three steps
    # on each of up to three profiles to show; the budget is checked on every one.
    seen = []
    for attempt in range(3):
        profile = measure_profile(_paced(reps[0]), lambda: (x[:, :-1], x[:, 1:]), reps[0].params, 2)
        for r in reps:
            r.zero_grad()
        budget = _budget(profile)
        tt = TickTock([_paced(r) for r in reps], profile, budget, [r.params for r in reps])
        for seed in range(3):
            batches = [_batches(4, 1 + 2 * seed + 10 * attempt), _batches(4, 2 + 2 * seed + 10 * attempt)]
            report = tt.run_step(batches)
            assert report.violations == 0 and report.peak_bytes <= budget
            assert all(len(losses) == 4 for losses in report.losses)
            for r in reps:
                r.zero_grad()
            seen.append((report.peak_bytes / profile.peak_bytes, tt.offset.offset_s, profile.period_s))
            if report.peak_bytes > 1.05 * profile.peak_bytes:
                return  # the waves did overlap
    raise AssertionError(f"the waves never overlapped (peak/profile peak, offset s, period s): {seen}")


class _Meet:
    """Wraps a wave's last layer so that both waves' forwards end together: both at their peak."""

    def __init__(self, layer, barrier: threading.Barrier) -> None:
        self.layer, self.barrier = layer, barrier

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer(x)
        self.barrier.wait(timeout=30)
        return out


def test_the_accounting_sums_both_waves_at_a_simultaneous_peak(replicas) -> None:
    # What the rules prevent, forced (no budget, offset 0, both forwards meet before the loss): the
    # measured total is both waves' peaks but for the loss's own small saves (deterministic bytes).
    reps, profile = replicas
    barrier = threading.Barrier(2)
    waves = []
    for r in reps:
        lw = stage_layers(r.model)
        lw.layers[-1] = _Meet(lw.layers[-1], barrier)
        waves.append(lw)
    tt = TickTock(waves, profile, None, [r.params for r in reps], offset_s=0.0)
    x = _batches(1, 3)
    report = tt.run_step([x, x])
    assert 1.95 * profile.peak_bytes < report.peak_bytes <= 2 * profile.peak_bytes
    for r in reps:
        r.zero_grad()


def test_merge_gradients_sums_over_waves_and_keeps_dtype() -> None:
    a = [torch.zeros(3, dtype=torch.float64, requires_grad=True), torch.zeros(2, requires_grad=True)]
    b = [torch.zeros(3, dtype=torch.float64, requires_grad=True), torch.zeros(2, requires_grad=True)]
    a[0].grad, b[0].grad = (
        torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64),
        torch.ones(3, dtype=torch.float64),
    )
    b[1].grad = torch.full((2,), 0.5)
    merge_gradients([a, b])
    for p in (a, b):
        assert p[0].grad is not None and p[0].grad.dtype == torch.float64
        assert p[0].grad.tolist() == [2.0, 3.0, 4.0]
        assert p[1].grad is not None and p[1].grad.tolist() == [0.5, 0.5]
    assert a[0].grad is not b[0].grad  # each wave owns its copy (its optimizer steps it in place)


def test_w3_the_inter_wave_rule_matches_numpy_step_for_step() -> None:
    data = regression_data(12)
    params = init_mlp()
    reference = numpy_sim(data, params)
    assert max_err(torch_ticktock(data, params), reference) <= 1e-8
    assert max_err(torch_sync_dp(data, params), reference) <= 1e-8  # the baseline: one replica, same batch
    # and the check can fail: dropping one wave's gradients is far off
    half = [[step[0], [(x, y, 0.0) for x, y, _ in step[1]]] for step in data]
    assert max_err(numpy_sim(half, params), reference) > 1e-3
    assert not np.allclose(reference[-1][0], params[0])


def test_two_waves_on_one_device_train_like_two_separate_replicas() -> None:
    batches = token_batches(3, TINY)
    expected = separate_replicas(batches)
    assert ticktock_replicas(batches) == pytest.approx(expected, abs=1e-6)
    assert expected[-1] != expected[0]
