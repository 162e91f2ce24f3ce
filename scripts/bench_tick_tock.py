"""Tick-tock co-location (Wavelet): acceptance W1-W3 of issue 19 and the end-to-end loss check.

- W1: the measured profile of a small transformer (one single-threaded wave, saved-activation bytes from
  saved_tensors_hooks, per-layer forward/backward times): the combined peak at d* and at d = 0 over one
  wave's peak, d* / P, and forward:backward.
- W2: two replica waves (one thread each, torch single-threaded) under an accounted budget of
  ``--budget`` x the single peak: budget violations, the measured peak, whether a simultaneous start is
  refused, and the pair's throughput over one wave alone (same micro-batches). Printed next to it: two
  free-running threads without tick-tock (no budget, started together), which is what the machine's
  cores allow; the difference is tick-tock's own cost (the tock's lag, waits). And the cores each run
  got (its threads' CPU seconds per second): on a box shared with other jobs, the reason a target is missed.
- W3: a float64 regression trained by two tick-tock waves (synchronous rule: gradients summed, one AdamW
  step) against a pure-numpy simulation, step for step; baseline: one replica with the same total batch.
- End to end: the transformer trained as two waves on one device against two separate replicas.

    python scripts/bench_tick_tock.py [--steps 4] [--micro 4] [--budget 1.4] [--json]

With ``--json`` the last line is one JSON object with ``peak_ratio_best``, ``peak_ratio_zero``,
``offset_over_period``, ``fb_ratio``, ``pair_throughput_ratio``, ``free_pair_ratio``, ``cores_*``,
``budget_violations``, ``simultaneous_refused``, ``w3_max_err``, ``e2e_max_loss_diff`` and ``wall_s``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from potluck.model.layerwise import stage_layers
from potluck.model.memprofile import measure_profile, offset_of
from potluck.model.stage import StageRunner
from potluck.peer.errors import ColocationRefused
from potluck.peer.train.ticktock import TickTock, admit, merge_gradients
from potluck.protocol.jobspec import ModelSpec, OptimizerSpec
from potluck.testbed.harness.ticktock import (
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

SPEC = ModelSpec(n_layers=6, d_model=192, n_heads=4, vocab_size=512, seq_len=128)
MICRO_BATCH = 4  # sequences per micro-batch


def _batches(spec: ModelSpec, n: int, g: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    out = []
    for _ in range(n):
        x = torch.randint(0, spec.vocab_size, (MICRO_BATCH, spec.seq_len + 1), generator=g)
        out.append((x[:, :-1], x[:, 1:], 1.0 / (2 * n)))
    return out


def _timed(tt: TickTock, runners: list[StageRunner], steps: int, micro: int) -> tuple[float, int, int, float]:
    """(seconds, violations, peak bytes, cores used: CPU seconds of the waves' threads per second) of
    ``steps`` steps; gradients merged and dropped after each."""
    g = torch.Generator().manual_seed(7)
    seconds, violations, peak, cpu = 0.0, 0, 0, 0.0
    for _ in range(steps):
        report = tt.run_step([_batches(SPEC, micro, g) for _ in runners])
        seconds += report.seconds
        violations += report.violations
        peak = max(peak, report.peak_bytes)
        cpu += sum(report.cpu_s)
        merge_gradients([r.params for r in runners])
        for r in runners:
            r.zero_grad()
    return seconds, violations, peak, cpu / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--micro", type=int, default=4, help="micro-batches per wave per step")
    ap.add_argument("--budget", type=float, default=1.4, help="accounted budget, x one wave's peak")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()

    reps = [StageRunner(SPEC, 0, SPEC.n_layers, 0, OptimizerSpec()) for _ in range(2)]
    g = torch.Generator().manual_seed(0)
    probe = _batches(SPEC, 1, g)[0]
    profile = measure_profile(stage_layers(reps[0].model), lambda: probe[:2], reps[0].params, repeats=5)
    for r in reps:
        r.zero_grad()
    off = offset_of(profile)
    fb = profile.backward_s / profile.forward_s
    print(f"W1  {SPEC.n_layers} layers d={SPEC.d_model} seq={SPEC.seq_len} micro-batch={MICRO_BATCH}")
    print(
        f"    P = {profile.period_s * 1e3:.1f} ms (forward {profile.forward_s * 1e3:.1f}, backward "
        f"{profile.backward_s * 1e3:.1f}, F:B = 1:{fb:.2f}), single peak {profile.peak_bytes / 2**20:.1f} MiB"
    )
    print(
        f"    d* = {off.offset_s * 1e3:.1f} ms = {off.offset_s / profile.period_s:.3f} P: combined peak "
        f"{off.ratio:.3f}x single; d = 0: {off.ratio_zero:.3f}x"
    )

    budget = args.budget * profile.peak_bytes
    try:
        admit(profile, budget, offset_s=0.0)
        refused = False
    except ColocationRefused:
        refused = True
    layers = [stage_layers(r.model) for r in reps]
    one = TickTock(layers[:1], profile, None, [reps[0].params])
    pair = TickTock(layers, profile, budget, [r.params for r in reps])
    free = TickTock(layers, profile, None, [r.params for r in reps], offset_s=0.0)
    _timed(one, reps[:1], 1, args.micro)  # warm-up
    t_one, _, _, cores_one = _timed(one, reps[:1], args.steps, args.micro)
    t_pair, violations, peak, cores_pair = _timed(pair, reps, args.steps, args.micro)
    t_free, _, free_peak, cores_free = _timed(free, reps, args.steps, args.micro)
    ratio, free_ratio = 2 * t_one / t_pair, 2 * t_one / t_free
    print(f"W2  budget {args.budget}x single peak; simultaneous start refused: {refused}")
    print(
        f"    one wave {t_one:.2f} s, tick-tock pair {t_pair:.2f} s: pair throughput {ratio:.2f}x one wave; "
        f"{violations} budget violations, measured peak {peak / profile.peak_bytes:.3f}x single"
    )
    print(
        f"    baseline: two free threads started together {t_free:.2f} s ({free_ratio:.2f}x), "
        f"peak {free_peak / profile.peak_bytes:.3f}x single (no budget)"
    )
    print(
        f"    cores the waves got (their threads' CPU s per s): one wave {cores_one:.2f}, "
        f"tick-tock pair {cores_pair:.2f}, free pair {cores_free:.2f}"
    )

    data = regression_data(20)
    params = init_mlp()
    reference = numpy_sim(data, params)
    w3 = max_err(torch_ticktock(data, params), reference)
    dp = max_err(torch_sync_dp(data, params), reference)
    print(
        f"W3  20 steps float64: tick-tock vs numpy max |err| {w3:.2e}; baseline sync DP, same batch: {dp:.2e}"
    )

    batches = token_batches(5, ModelSpec(n_layers=3, d_model=32, n_heads=4, vocab_size=64, seq_len=16))
    a, b = separate_replicas(batches), ticktock_replicas(batches)
    e2e = max(abs(x - y) for x, y in zip(a, b, strict=True))
    print(
        f"E2E 5 steps: two waves on one device vs two replicas, loss {b[-1]:.6f} vs {a[-1]:.6f}, "
        f"max diff {e2e:.2e}"
    )
    wall = time.perf_counter() - t0
    if args.json:
        print(
            json.dumps(
                {
                    "peak_ratio_best": round(off.ratio, 4),
                    "peak_ratio_zero": round(off.ratio_zero, 4),
                    "offset_over_period": round(off.offset_s / profile.period_s, 4),
                    "fb_ratio": round(fb, 3),
                    "pair_throughput_ratio": round(ratio, 3),
                    "free_pair_ratio": round(free_ratio, 3),
                    "cores_one": round(cores_one, 2),
                    "cores_pair": round(cores_pair, 2),
                    "cores_free_pair": round(cores_free, 2),
                    "budget_violations": violations,
                    "measured_peak_ratio": round(peak / profile.peak_bytes, 4),
                    "simultaneous_refused": refused,
                    "w3_max_err": w3,
                    "w3_baseline_err": dp,
                    "e2e_max_loss_diff": e2e,
                    "wall_s": round(wall, 1),
                }
            )
        )


if __name__ == "__main__":
    main()
