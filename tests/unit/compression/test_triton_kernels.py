"""The Triton kernels (run by the interpreter on CPU) must give the torch path's bytes exactly."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from . import triton_check

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def _run_interpreted() -> dict[str, str]:
    env = dict(os.environ, TRITON_INTERPRET="1", POTLUCK_CODEC_BACKEND="triton")
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.unit.compression.triton_check"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow  # the interpreted kernels run in a fresh process
def test_triton_interpreter_matches_torch_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POTLUCK_CODEC_BACKEND", "eager")
    want = triton_check.run()
    got = _run_interpreted()
    assert (got.pop("backend"), want.pop("backend")) == ("triton", "torch")  # both paths really ran
    assert got.keys() == want.keys()
    mismatches = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not mismatches
