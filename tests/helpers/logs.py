"""Reading the logs of processes a test started: wait for a line, parse the launch's JSON summary."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

POLL_S = 0.2  # seconds between reads of a log that is still being written


def wait_for(log: Path, pattern: str, timeout_s: float, start: int = 0) -> re.Match[str]:
    """The first match of ``pattern`` in ``log`` at or after character ``start``, once it appears;
    AssertionError with the log's tail after ``timeout_s``."""
    compiled = re.compile(pattern)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if m := compiled.search(log.read_text(errors="replace"), start):
            return m
        time.sleep(POLL_S)
    raise AssertionError(f"{pattern!r} not seen in {timeout_s} s:\n{log.read_text(errors='replace')[-3000:]}")


def launch_summary(text: str) -> dict[str, Any]:
    """The last one-line JSON summary `potluck launch --json` printed."""
    lines = [line for line in text.splitlines() if line.startswith('{"steps"')]
    assert lines, text[-3000:]
    return json.loads(lines[-1])


def launch_finished(popen: subprocess.Popen[bytes], log: Path, steps: int, timeout_s: float) -> str:
    """Wait for a ``potluck launch --json`` process to end; assert it exited 0 at the job's last step
    (``steps``). Returns its log; AssertionError with the log's tail when it runs past ``timeout_s``."""
    try:
        popen.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        tail = log.read_text(errors="replace")[-4000:]
        raise AssertionError(f"the launch did not end within {timeout_s} s:\n{tail}") from None
    text = log.read_text(errors="replace")
    assert popen.returncode == 0, text[-3000:]
    assert launch_summary(text)["steps"] == steps, text[-3000:]
    return text


def assert_no_step_lost(text: str, steps: int, before: int, event: str) -> dict[str, Any]:
    """The launch ended at the job's last step (``steps``), and every plan epoch after the first started
    at or after ``before``, the step the swarm had committed before ``event``. Returns the summary."""
    summary = launch_summary(text)
    assert summary["steps"] == steps, summary
    starts = [int(s) for s in re.findall(r"plan epoch \d+: .*?from step (\d+)", text)][1:]
    assert starts and min(starts) >= before, f"epochs after the {event} start at {starts}; committed {before}"
    return summary
