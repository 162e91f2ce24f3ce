"""The benchmarks' step-time report (``scripts/bench_training.py``): a peer whose timings were never
read leaves the calibrated model without a figure instead of failing the run."""

import sys
from pathlib import Path
from types import SimpleNamespace

from potluck.coordinator.state import SwarmState
from potluck.protocol.identity import Identity
from potluck.protocol.training import StepTiming
from potluck.testbed.harness.training import make_plan, tiny_job

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_training import timing_report

JOB = tiny_job()
IDS = [Identity.generate().peer_id for _ in range(2)]
PLAN = make_plan(JOB, [[IDS[0]], [IDS[1]]], [(0, 2), (2, 4)])
STEP = StepTiming(compute=0.1, total=0.3)


def report(timings: dict) -> dict:
    watcher = SimpleNamespace(plan=PLAN, swarm_state=SwarmState("swarm", 0.0), timings=timings)
    return timing_report(watcher, JOB, 0)  # type: ignore[arg-type]


def test_every_peer_read_gives_a_calibrated_figure():
    out = report({IDS[0]: {1: STEP}, IDS[1]: {1: STEP, 2: STEP}})
    assert out["calibrated_step_s"] > 0 and out["calibrated_error"] is not None
    assert out["uncalibrated_peers"] == []


def test_a_peer_never_read_leaves_the_calibration_out_and_says_whose():
    out = report({IDS[1]: {1: STEP, 2: STEP}})
    assert out["calibrated_step_s"] is None and out["calibrated_error"] is None
    assert out["uncalibrated_peers"] == [IDS[0]]
    assert out["step_s"] == 0.3  # the peers that were read still give the measured step


def test_no_peer_read_at_all_gives_no_figures_and_names_them_all():
    out = report({})
    assert out["step_s"] is None and out["prediction_error"] is None
    assert out["calibrated_step_s"] is None and out["calibrated_error"] is None
    assert sorted(out["uncalibrated_peers"]) == sorted(IDS) and out["peers"] == {}


def test_bench_wan_compares_the_losses_at_the_tokens_both_runs_reached() -> None:
    """hivemind's run can end short of potluck's tokens (12-07: 592,128 of 655,360): both losses are
    then read where it ended, not left out."""
    from bench_wan import compared_tokens, loss_at, smoothed

    potluck = 80 * 8192
    short = {"losses": [[8960, 5.0], [300_000, 1.0], [592_128, 0.66]]}
    assert compared_tokens(potluck, short) == 592_128
    assert compared_tokens(potluck, {"losses": [[8960, 5.0], [660_000, 0.6]]}) == potluck
    assert compared_tokens(potluck, None) == potluck
    curve = smoothed([(t, v) for t, v in short["losses"]], window=1)
    assert loss_at(curve, potluck) is None and loss_at(curve, 592_128) == 0.66
