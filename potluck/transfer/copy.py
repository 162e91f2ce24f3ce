"""Copying a stage's checkpoint from its live holders onto this machine's disk: the one routine behind
the job owner's copy (``coordinator/copies.py``) and a copy holder's duty (``peer/state/copies.py``).

No disk is shared, so a checkpoint first exists only on the peers that wrote it. ``copy_stage`` pulls
stage j's layers at step s from every holder at once (``pull.py``: chunks hashed and checked against
each holder's signed manifest), asking again while holders are still writing it (``settled``), and
writes them under ``root`` as that stage's checkpoint (``model/checkpoint.py``'s layout, with the
plan's ``StageMeta``). ``Background`` runs one copy at a time off the caller's loop: training never waits
for a copy, and a copy never piles up behind another.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from potluck.model.checkpoint import prune, save_stage
from potluck.net.streams import Streams
from potluck.protocol.checkpoints import plan_stage_meta
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import TrainPlan
from potluck.transfer.errors import StateError
from potluck.transfer.manifest import StateWant
from potluck.transfer.pull import pull_state
from potluck.transfer.server import TransferConfig
from potluck.transfer.snapshot import rename

logger = logging.getLogger(__name__)

T = TypeVar("T")
# Backoff while holders settle, seconds. Short: a hand-off's holders settle all at once at its start
# step, and every peer's start barrier waits for the last fetch, so a long wait here idles the swarm.
SETTLE_FIRST_WAIT_S, SETTLE_MAX_WAIT_S = 0.2, 1.0


async def settled(fetch: Callable[[], Awaitable[T]], settle_s: float, name: str) -> T:
    """``fetch()``, asked again while holders may still be settling: a new plan reaches every peer at
    once, and a holder offers its state only once it is written (a checkpoint) or its previous run has
    unwound (live state), so a fetch in the first seconds can find "no state yet" where a moment later
    there is. A holder that refuses a stream is dead, not settling: a failure where every holder did is
    raised at once; one where some live holder may still settle (``StateError.settling``) is not."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + settle_s
    wait = SETTLE_FIRST_WAIT_S
    while True:
        try:
            return await fetch()
        except StateError as e:
            if loop.time() + wait > give_up or (e.unreachable and not e.settling):
                raise
            logger.info("%s: %s; asking again in %.1f s", name, e, wait)
            await asyncio.sleep(wait)
            wait = min(2 * wait, SETTLE_MAX_WAIT_S)


async def copy_stage(
    streams: Streams,
    protocol: str,
    holders: Sequence[str],
    job: JobSpec,
    plan: TrainPlan,
    stage: int,
    step: int,
    root: Path,
    cfg: TransferConfig,
    timeout_s: float,
) -> int:
    """Pull stage ``stage`` of ``plan`` at ``step`` from ``holders`` and write it under ``root``; return
    the bytes written. ``StateError`` when no holder serves it within ``timeout_s`` seconds, ``OSError``
    when it cannot be written."""
    a = plan.stages[stage]
    want = StateWant(job.name, job.model, job.seed, step, a.first_layer, a.last_layer)
    name = f"stage {stage} at step {step}"
    try:
        tensors = await asyncio.wait_for(
            settled(lambda: pull_state(streams, protocol, holders, want, cfg), cfg.settle_s, name),
            min(timeout_s, cfg.deadline_s),
        )
    except TimeoutError:
        raise StateError(f"{name}: no complete copy within {timeout_s:.0f} s") from None
    meta = plan_stage_meta(job, plan, stage, step)
    await asyncio.to_thread(save_stage, root, rename(tensors, -a.first_layer), meta)
    return sum(t.numel() * t.element_size() for t in tensors.values())


async def prune_copies(root: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints under ``root`` (``model/checkpoint.prune``), off the loop."""
    await asyncio.to_thread(prune, root, keep)


class Background:
    """One copy at a time, in a task of its own: ``start`` only when ``idle``; ``flush`` waits for the
    one under way, bounded; ``close`` cancels it."""

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None

    @property
    def idle(self) -> bool:
        return self._task is None or self._task.done()

    def start(self, copy: Coroutine[Any, Any, Any], name: str) -> None:
        assert self.idle, "a copy is already under way"
        self._task = asyncio.create_task(copy, name=name)

    async def flush(self, timeout_s: float) -> None:
        if self._task is not None and not self._task.done():
            await asyncio.wait({self._task}, timeout=timeout_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})
            self._task = None
