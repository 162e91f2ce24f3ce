"""The GPU check scripts cannot rot without a GPU: their --cpu-dry-run runs the same code on the CPU.
(The swarm check's dry run spawns peer processes: tests/integration/training/test_gpu_swarm_check.py.)"""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("OUT", "TRITON_INTERPRET", "POTLUCK_CODEC_BACKEND")
    }
    return {**env, "PYTHONPATH": str(ROOT), **extra}


@pytest.mark.slow  # the script's whole dry run, in a fresh process
@pytest.mark.timeout(300)
def test_kernels_check_dry_run_compares_every_codec_and_times_every_kernel(tmp_path):
    out = tmp_path / "k.json"
    proc = subprocess.run(
        [sys.executable, "scripts/gpu_kernels_check.py", "--cpu-dry-run", "--out", str(out)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["dry_run"] and report["ok"]
    cases = {(c["spec"], c["error_feedback"]) for c in report["identity"]}
    assert len(cases) == 12  # int8/4/2 x nearest/stochastic x with/without error feedback
    assert all(c["identical"] for c in report["identity"])
    kernels = report["bandwidth"]["kernels"]
    assert len(kernels) == 9 and all("error" not in k for k in kernels), kernels
    assert len(report["bandwidth"]["api"]) == 6


def _script(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def test_kernels_check_without_a_gpu_says_how_to_dry_run(capsys, monkeypatch):
    # In this process (the dry run above runs the script as a script): its main() answers before it
    # touches a kernel, so no fresh process and torch import are needed to see what it says.
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for name in ("OUT", "TRITON_INTERPRET", "POTLUCK_CODEC_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    assert _script("gpu_kernels_check").main([]) == 2
    assert "--cpu-dry-run" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_wheels.sh"])
def test_shell_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)]).returncode == 0
    assert os.access(ROOT / "scripts" / script, os.X_OK)


def test_swarm_check_compares_losses_by_steps_done():
    g = _script("gpu_swarm_check")
    ref = [5.0, 4.0, 3.0]
    ok = g.compare({1: 5.05, 3: 3.01}, ref, rel_tol=0.02)
    assert ok["within_tolerance"] and ok["compared_steps"] == 2 and ok["worst_step"] == 1
    assert not g.compare({2: 4.5}, ref, rel_tol=0.02)["within_tolerance"]
    assert not g.compare({}, ref, rel_tol=0.02)["within_tolerance"]  # nothing seen is no match
    job = g.job_for("d768", 30, (1, 2), Path("/tmp/ck"), dry=False)
    assert (job.model.n_layers, job.model.d_model, job.min_peers) == (12, 768, 2)
