"""Every entry point in ``scripts/`` answers ``--help``: a benchmark or check a doc names must at least
start (issue 34: no behaviour change from moving the code it imports). Script-only modules (``_*.py``)
are imported by those and are not entry points."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
ENTRY_POINTS = sorted(p for p in SCRIPTS.glob("*.py") if not p.name.startswith("_"))


def _help(script: Path) -> tuple[str, int, bool, str]:
    """(name, exit code, whether it printed a usage line, the end of what it printed)."""
    done = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=300, check=False
    )
    out = done.stdout + done.stderr
    return script.name, done.returncode, "usage" in out.lower(), out[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(600)  # ~100 s of imports: 56 s alone on 2 cores, over 180 s beside a process swarm
def test_every_script_answers_help():
    assert len(ENTRY_POINTS) >= 20, ENTRY_POINTS  # the glob found the scripts
    with ThreadPoolExecutor(max_workers=4) as pool:  # mostly imports: four at a time on two cores
        results = list(pool.map(_help, ENTRY_POINTS))
    bad = [f"{name}: exit {rc}\n{out}" for name, rc, _, out in results if rc != 0]
    assert not bad, "\n\n".join(bad)
    quiet = [name for name, _, usage, _ in results if not usage]
    assert not quiet, f"no usage text from {quiet}"
