"""The hivemind baseline of the headline benchmark (potluck/testbed/baseline/, which
scripts/wan_hivemind.py and scripts/wan_hivemind_local.py run) on loopback: two workers train potluck's
demo model with hivemind.Optimizer for a few epochs, really average (their weights move together, far
from where they started), learn, and leave no process behind."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("hivemind")
pytest.importorskip("torch")

from potluck.testbed.baseline import local
from potluck.testbed.baseline.summary import read_records

pytestmark = [pytest.mark.integration, pytest.mark.extended, pytest.mark.timeout(150)]

EPOCHS = 4


def gone(pid: int) -> bool:
    """No such process, or a zombie (dead, not yet reaped by whoever inherited it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_two_workers_average_and_learn(tmp_path: Path) -> None:
    args = local.parse_args(
        [
            "--peers",
            "2",
            "--epochs",
            str(EPOCHS),
            "--compression",
            "none",  # lossless: averaged peers hold the same weights up to float summation order
            "--matchmaking-time",
            "2",
            "--run-dir",
            str(tmp_path),
            "--run-id",
            f"test-wan-hivemind-{tmp_path.name}",
            "--timeout",
            "120",
        ]
    )
    summary = local.run(args)
    peers = [read_records(tmp_path / f"peer{i}.jsonl") for i in range(2)]
    starts = [next(r for r in rs if r["event"] == "start") for rs in peers]
    dones = [next(r for r in rs if r["event"] == "done") for rs in peers]

    # both reached the same epoch, the last one
    assert [d["epoch"] for d in dones] == [EPOCHS, EPOCHS]
    assert summary["epochs"] == EPOCHS and summary["peers_done"] == 2

    # losses are finite and the swarm's loss fell
    losses = [r["loss"] for rs in peers for r in rs if r["event"] == "epoch"]
    assert losses and all(math.isfinite(v) for v in losses)
    assert summary["loss_last"] < summary["loss_first"], summary

    # they averaged: the same weights on both, far from the (shared) initial ones
    assert starts[0]["fingerprint"] == pytest.approx(starts[1]["fingerprint"])
    moved = max(abs(a - b) for a, b in zip(dones[0]["fingerprint"], starts[0]["fingerprint"], strict=True))
    apart = max(abs(a - b) for a, b in zip(dones[0]["fingerprint"], dones[1]["fingerprint"], strict=True))
    assert moved > 0.1 and apart < 0.01 * moved, (moved, apart)
    assert dones[0]["param_change"] > 0

    # bytes were counted at the daemons: at least one fp32 half-model each way per epoch
    half_model = starts[0]["n_params"] * 4 / 2
    assert summary["bytes_sent"] > EPOCHS * half_model

    # every process is gone: workers, their hivemind processes, their p2p daemons
    pids = [p for s in starts for p in (s["pid"], s["p2pd_pid"], *s["child_pids"]) if p]
    assert len(pids) >= 2 * 3
    left = [p for p in pids if not gone(p)]
    assert not left, f"processes left behind: {left}"
