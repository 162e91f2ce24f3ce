"""potluck.lifeline with real processes: a grandchild dies when its parent is SIGKILLed, through
PR_SET_PDEATHSIG and through the watchdog fallback."""

import os
import signal
import subprocess
import sys
import time

import pytest

from potluck import lifeline
from tests.helpers.swarm import kill_recorded, proc_info, still_running

# The parent: starts `sleep 600` guarded one way or the other, prints its PID, then waits to be killed.
PARENT = """
import signal, subprocess, sys, time
from potluck import lifeline
mode = sys.argv[1]
if mode == "pdeathsig":
    child = subprocess.Popen(["sleep", "600"], preexec_fn=lifeline.preexec(signal.SIGKILL))
else:
    child = subprocess.Popen(["sleep", "600"])
    lifeline.watch(child.pid)
print(child.pid, flush=True)
time.sleep(600)
"""


def _orphan_dies(mode: str) -> float:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    child = None
    try:
        assert parent.stdout is not None
        child = proc_info(int(parent.stdout.readline()))
        assert child is not None and still_running(child)
        if mode == "watch":
            time.sleep(0.5)  # let the watchdog's interpreter start before its parent dies
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=5)
        start = time.monotonic()
        while still_running(child) and time.monotonic() - start < 5.0:
            time.sleep(0.05)
        assert not still_running(child), f"{mode}: child {child.pid} outlived its SIGKILLed parent"
        return time.monotonic() - start
    finally:
        if child is not None:
            kill_recorded([child])
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=5)


@pytest.mark.skipif(not lifeline.PDEATHSIG_AVAILABLE, reason="PR_SET_PDEATHSIG is Linux only")
def test_pdeathsig_child_dies_with_its_parent():
    assert _orphan_dies("pdeathsig") < 1.0  # the kernel signals at once


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_watchdog_fallback_kills_the_orphan():
    assert _orphan_dies("watch") < 1.0 + lifeline.WATCH_POLL_S


def test_preexec_is_none_only_where_unsupported():
    assert (lifeline.preexec() is None) == (not lifeline.PDEATHSIG_AVAILABLE)
