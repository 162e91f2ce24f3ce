"""Serving a coded query: ask every worker at once, decode from the first replies that determine all.

``first_decodable`` is the client half of ``potluck serve`` without the network: it takes one awaitable
per coded worker (a stream request, in the swarm; a coroutine, in tests), and as soon as the replies
received so far are decodable it decodes them in float64 and cancels the rest. A worker that fails (a
dead peer: its stream errors) counts as a straggler that never answers; ``timeout_s`` bounds the wait
for peers that hang. r stragglers or dead peers therefore cost nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence

import numpy as np

from potluck.classpar.code import ErasureCode
from potluck.classpar.errors import CodeError

logger = logging.getLogger(__name__)


async def first_decodable(
    code: ErasureCode, replies: Sequence[Awaitable[np.ndarray]], *, timeout_s: float
) -> tuple[np.ndarray, list[int]]:
    """The units' decoded scores (K, ...) and the workers used, in arrival order."""
    if len(replies) != code.n:
        raise CodeError(f"{len(replies)} requests for a code of {code.n} workers")
    tasks = {asyncio.ensure_future(r): j for j, r in enumerate(replies)}
    arrived: list[int] = []
    payloads: list[np.ndarray] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s  # seconds on the loop's clock
    pending = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(
                pending, timeout=max(0.0, deadline - loop.time()), return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                break  # timed out
            for task in sorted(done, key=lambda t: tasks[t]):
                if task.exception() is not None:
                    logger.debug("worker %d failed: %s", tasks[task], task.exception())
                    continue
                arrived.append(tasks[task])
                payloads.append(np.asarray(task.result(), dtype=np.float64))
            if code.decodable(arrived):
                return code.decode(arrived, np.stack(payloads)), arrived
    finally:
        for task in pending:
            task.cancel()
    raise CodeError(f"only workers {arrived} answered within {timeout_s} s: not enough to decode")
