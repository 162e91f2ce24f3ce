"""Recomputation checks in the machine's idle time: one worker thread at the lowest CPU priority.

A gradient check (``recheck.py``) or a pipeline replay (``spot.py``) recomputes a step or a micro-batch
of another replica: real compute, run in the background while training goes on. On a default-priority
thread it takes its share of the cores from the training it checks (the Byzantine benchmark's checks
cost whole steps' compute beside 10 replicas on 2 cores). On a thread at nice 19 the kernel gives it only
CPU time that nothing else wants: the pipeline's bubbles and the waits for slow links. A check then takes
longer to finish, which costs nothing: its verdict is testimony for later steps.

The price of nice 19: the worker shares the interpreter lock with the event loop, and when the kernel
preempts it while it holds the lock, the loop waits until it runs again. With three CPU hogs on 2 cores
an asyncio loop beside a replaying worker woke up 183 ms late at p99 (14 ms at nice 5, 4 ms with no
worker; ``scripts/bench_idle_priority.py``). Nice 5 was tried for that and measured worse where it
counts: the spot-check benchmark's step-time overhead on the same box and day was +19% / +41% (1% / 5%
of micro-batches checked) at nice 5 against +6.7% / +7.2% at nice 19 (docs/benchmarks/trust.md). The
stalls happen only while a check runs on a saturated machine; the lost CPU happens on every check.

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
NICE = 19  # the lowest priority: what no other thread wants (the docstring weighs nice 5)

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
