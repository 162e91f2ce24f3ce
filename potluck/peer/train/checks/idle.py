"""Recomputation checks off the training path: one worker thread at a lowered CPU priority.

A gradient check (``recheck.py``) or a pipeline replay (``spot.py``) recomputes a step or a micro-batch
of another replica: real compute, run in the background while training goes on. On a default-priority
thread it takes its share of the cores from the training it checks (the Byzantine benchmark's checks
cost whole steps' compute beside 10 replicas on 2 cores). Lowered, the kernel gives it less of the CPU
whenever training wants it, and all it leaves over (the pipeline's bubbles, the waits for slow links).
A check then takes longer to finish, which costs nothing: its verdict is testimony for later steps.

Why nice 5 and not 19: the worker shares the interpreter lock with the event loop. A thread that holds
the lock when the kernel preempts it keeps it until it runs again, and at nice 19 (1/68 of a nice-0
thread's share) that is a long wait on a busy machine. Measured with three CPU hogs on 2 cores (one
asyncio loop sleeping 2 ms between bursts of torch work, the worker replaying a small model beside it):
the loop woke up to 190 ms late (p99) beside a nice-19 worker, 18 ms at nice 5, 22 ms at nice 0, 4 ms
with no worker. Nice 5 (about 1/3 of a nice-0 thread's share) keeps the event loop as prompt as nice 0
does while the checks take about a third of the CPU they would.

Only the calling thread is lowered: torch's intra-op threads, which a CPU stage with several threads
also uses, keep their priority, and a GPU stage's recomputation shares the device with training at the
same stream priority (docs/security.md). Where thread priorities are not supported the worker runs at
normal priority.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
NICE = 5  # about 1/3 of a default thread's CPU share (the module's docstring says why not 19)

_pool: ThreadPoolExecutor | None = None


def _lower() -> None:
    """The worker thread's initializer: drop its own CPU priority (Linux: per thread, by its TID) to
    ``NICE``, or leave it where a process already started lower."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(NICE, os.getpriority(os.PRIO_PROCESS, tid)))
    except (AttributeError, OSError) as e:
        logger.info("checks run at normal priority: %s", e)


def _forget_pool() -> None:
    global _pool
    _pool = None  # a forked child has none of its parent's worker threads


os.register_at_fork(after_in_child=_forget_pool)


def _workers() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="potluck-check", initializer=_lower)
    return _pool


async def in_idle_time(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on the low-priority check worker (one at a time, in the order asked)."""
    return await asyncio.get_running_loop().run_in_executor(_workers(), functools.partial(fn, *args))
