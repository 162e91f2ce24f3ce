"""The product end to end with real processes: `potluck demo` trains 2 stages x 2 replicas of peer
processes on loopback, writes a checkpoint, and `potluck generate` samples from it."""

import json
from pathlib import Path

import pytest

from potluck.protocol.checkpoints import check_step
from tests.helpers.swarm import potluck_cli

pytestmark = [pytest.mark.integration, pytest.mark.extended, pytest.mark.timeout(400)]


def test_demo_trains_and_generate_samples(tmp_path):
    run = potluck_cli("demo", "--steps", "12", "--json", "--run-dir", str(tmp_path), timeout=360)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 12 and summary["stages"] == 2 and summary["replicas"] == 2
    assert summary["loss_last"] < summary["loss_first"] - 0.5  # it learns from the first step on
    assert summary["tokens_per_s"] > 0 and summary["bytes_per_step"] > 0
    ref = check_step(Path(summary["checkpoint"]))  # complete: both stages, hashes match
    assert ref.step == 12 and ref.n_stages == 2
    out = potluck_cli(
        "generate", summary["checkpoint"], "--prompt", "ada adds", "--max-tokens", "16", "--temperature", "0"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ada adds") and len(out.stdout.strip()) > len("ada adds")
    # Peers ended cleanly (SIGTERM path), not with a crash.
    for log in tmp_path.glob("peer*.log"):
        assert "Traceback" not in log.read_text(errors="replace"), log.name
