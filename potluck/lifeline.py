"""Child processes that die with the process that started them, however it dies.

A ``finally`` block or a signal handler cannot run when the parent is SIGKILLed (the OOM killer, a
closed container, ``kill -9``), and a child in its own session gets no SIGHUP either; without this its
coordinator, peers and p2pd daemons run on, burning CPU, with nobody left to reap them.

On Linux the child asks the kernel for a signal when its parent dies: ``prctl(PR_SET_PDEATHSIG)``
between fork and exec (``preexec()``, a ``preexec_fn`` for ``subprocess.Popen``). The setting survives
``exec`` and needs no process of ours to be alive. Note "parent" means the *thread* that forked: spawn
from a thread that lives as long as the child should (the main thread, an event loop's thread), never
from a short-lived worker thread.

Elsewhere (macOS, BSD) ``watch()`` starts a small watchdog process that polls for the parent's death
and then kills the child (or its process group).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
WATCH_POLL_S = 0.5  # how often the fallback watchdog checks its parent and the child

_Prctl = Callable[[int, int, int, int, int], int]


def _load_prctl() -> _Prctl | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # a libc without prctl (static builds, odd sandboxes)
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    prctl: _Prctl = fn
    return prctl


# Resolved once in the parent, so the child calls an already-loaded function between fork and exec.
_PRCTL = _load_prctl()
PDEATHSIG_AVAILABLE = _PRCTL is not None


def preexec(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``sig`` when the calling thread's process dies.

    ``None`` where the kernel has no such feature: then call ``watch(child_pid)`` after the spawn."""
    prctl = _PRCTL
    if prctl is None:
        return None
    parent = os.getpid()

    def set_pdeathsig() -> None:
        # Runs in the forked child, before exec: only async-signal-safe work here (one syscall, no logging).
        if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        # The parent may have died between fork and prctl; then no signal will ever come, so act now.
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return set_pdeathsig


# Runs as `python -c WATCHDOG parent_pid child_pid sig group poll_s`: stdlib only, no potluck import
# (fast, and it must not depend on the parent's environment staying importable).
WATCHDOG = """
import os, sys, time
parent, child, sig, group = (int(a) for a in sys.argv[1:5])
poll_s = float(sys.argv[5])
def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
while alive(child):
    if os.getppid() != parent:
        try:
            (os.killpg if group else os.kill)(child, sig)
        except (ProcessLookupError, PermissionError):
            pass
        break
    time.sleep(poll_s)
"""

_watchdogs: list[subprocess.Popen[bytes]] = []  # kept so they are reaped (polled) on later calls


def watch(child_pid: int, sig: int = signal.SIGKILL, group: bool = False) -> subprocess.Popen[bytes]:
    """Fallback where ``preexec()`` is ``None``: a watchdog that sends ``sig`` to ``child_pid`` (its
    process group when ``group``) once this process is gone, and exits when the child does.

    It polls every ``WATCH_POLL_S`` s, so the child outlives its parent by at most that long; a PID the
    system reuses within that window could be hit, which is why this is only the fallback."""
    global _watchdogs
    _watchdogs = [w for w in _watchdogs if w.poll() is None]
    dog = subprocess.Popen(
        [
            sys.executable,
            "-c",
            WATCHDOG,
            str(os.getpid()),
            str(child_pid),
            str(int(sig)),
            str(int(group)),
            str(WATCH_POLL_S),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C in the terminal must not kill the watchdog before the child
    )
    _watchdogs.append(dog)
    logger.debug("watchdog %d guards pid %d (no PR_SET_PDEATHSIG here)", dog.pid, child_pid)
    return dog


def after_spawn(child_pid: int, sig: int = signal.SIGKILL, group: bool = False) -> None:
    """Call after spawning with ``preexec_fn=preexec(sig)``: where that was ``None``, start ``watch()``."""
    if not PDEATHSIG_AVAILABLE:
        watch(child_pid, sig, group)
