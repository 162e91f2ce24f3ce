"""scripts/gpu_swarm_check.py --cpu-dry-run: the GPU swarm check's whole path (coordinator, two peer
processes with --device/--precision/--max-memory, the CPU reference, the loss comparison, the JSON)
on the CPU, with a tiny model in bf16 autocast."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.extended, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]


def test_swarm_check_dry_run_trains_and_matches_the_reference(tmp_path):
    out = tmp_path / "swarm.json"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/gpu_swarm_check.py",
            "--cpu-dry-run",
            "--models",
            "demo",
            "--threads",
            "1",
            "--run-dir",
            str(tmp_path / "runs"),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    assert run["precision"] == "bf16" and run["device"] == "cpu" and run["grid"] == "1x2"
    assert run["summary"]["replicas"] == 2 and run["summary"]["steps"] == run["steps"]
    assert run["loss"]["within_tolerance"] and run["loss"]["compared_steps"] >= 1
    assert run["gpu"]["samples"] == 0  # no nvidia-smi here
