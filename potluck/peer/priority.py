"""A newcomer's start-up at low CPU priority (issue 38, item 3).

A peer that joins a running swarm first imports torch and hivemind, starts its daemons, probes its
device and fetches its stage's state: seconds of CPU that, on a machine it shares with peers already
training (several GPUs in one box, or a test swarm on one host), come out of their steps. So the peer
command starts at ``START_NICE`` (Linux nice, inherited by every thread and child process started
after it: the p2p daemon, the DHT's process) and goes back to the priority it had once it holds its
first state, as it starts training (``restore``).

Raising a priority back needs CAP_SYS_NICE (root, or an RLIMIT_NICE that allows it). Without it the
peer stays at ``START_NICE``, said once at INFO: on a machine of its own that changes nothing (nice
only orders threads that compete for a core), and on a shared desktop the volunteer's own programs
go first.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

START_NICE = 10  # between the trainers (0) and the idle-time checks (19, peer/train/checks/idle.py)

_base: int | None = None  # the priority before ``lower``; None: not lowered (or already restored)
_lowered = START_NICE  # the priority ``lower`` set


def lower(nice: int = START_NICE) -> bool:
    """Lower this process's priority to ``nice`` for its start-up; call before it starts threads or
    children (Linux applies nice per thread, and new ones inherit it). Returns whether it lowered it
    (never raises one that is already lower: a volunteer who started it under ``nice 19`` keeps that)."""
    global _base, _lowered
    if nice <= 0:
        return False
    try:
        base = os.getpriority(os.PRIO_PROCESS, 0)
        if base >= nice:
            return False
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except (AttributeError, OSError) as e:  # not Linux-like, or refused: start at normal priority
        logger.debug("start-up priority not lowered: %s", e)
        return False
    _base, _lowered = base, nice
    return True


def restore() -> bool:
    """Put every thread of this process and of its descendants that is still at the start-up priority
    back to the one ``lower`` found (a thread that chose its own, such as the idle-time check worker at
    nice 19, keeps it). Returns whether it did; at most once (later calls do nothing)."""
    global _base
    if _base is None:
        return False
    base, _base = _base, None
    for pid in [os.getpid(), *_descendants(os.getpid())]:
        for tid in _threads(pid):
            try:
                if os.getpriority(os.PRIO_PROCESS, tid) == _lowered:
                    os.setpriority(os.PRIO_PROCESS, tid, base)
            except ProcessLookupError:
                continue  # a thread that ended meanwhile
            except OSError as e:  # EACCES/EPERM: raising a priority needs CAP_SYS_NICE
                logger.info("running on at start-up priority (nice %d): %s", _lowered, e.strerror)
                return False
    return True


def _threads(pid: int) -> list[int]:
    try:
        return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return []  # it ended


def _descendants(root: int) -> list[int]:
    """Processes under ``root`` (children, theirs, ...), from /proc's parent links."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1:
            parent[int(entry.name)] = int(fields[1])
    out, frontier = [], [root]
    while frontier:
        nxt = [p for p, pp in parent.items() if pp in frontier]
        out += nxt
        frontier = nxt
    return out
