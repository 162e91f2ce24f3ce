"""How a potluck process runs concurrent work: named tasks on one TaskGroup, stop on signals, bounded waits.

The peer daemon, its worker and the coordinator service all run a few long-lived loops side by side.
They share one set of rules, kept here:

- every task has a name; a task that raises is logged once, with its name and traceback, its siblings
  are cancelled, and the group raises ``TaskFailed`` naming it (the original error is the cause);
- stopping is bounded: a cancelled task gets ``grace_s`` seconds to run its cleanup, after which it is
  left behind with a warning, so a shutdown never hangs on one stuck task;
- SIGINT and SIGTERM set an event (``stop_on_signals``), and the previous handlers come back after;
- a wait with a time limit (``bounded``) fails with an error that says what did not finish in time.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TypeVar

from potluck.errors import DeadlineExceeded, TaskFailed

logger = logging.getLogger(__name__)

T = TypeVar("T")
DEFAULT_GRACE_S = 2.0  # seconds a cancelled task may spend in its cleanup before it is left behind
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
DUMP_FRAMES = 8  # innermost frames of each task that dump_tasks_on logs


class Supervisor:
    """Named tasks on one ``asyncio.TaskGroup``: start them at any time, cancel one, or stop them all.

    Leaving the ``async with`` block waits for the tasks (cancelled ones at most ``grace_s``); if one
    failed, every other was cancelled and ``TaskFailed`` is raised."""

    def __init__(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.grace_s = grace_s
        self._group = asyncio.TaskGroup()

    async def __aenter__(self) -> Supervisor:
        await self._group.__aenter__()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self._group.__aexit__(et, exc, tb)
        except BaseExceptionGroup as group:
            failed = [e for e in group.exceptions if isinstance(e, TaskFailed)]
            if failed:  # each failure was logged where it happened; the first one is what stopped us
                raise failed[0]  # noqa: B904 - its cause is the task's own error, the group adds nothing
            if len(group.exceptions) == 1:  # the block's own error, not wrapped in a group
                raise group.exceptions[0]  # noqa: B904
            raise

    def start(self, name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as the task ``name``; a failure stops the whole group."""
        # The work runs in a task of its own so that cancelling it can be bounded (see _guarded).
        work = asyncio.create_task(coro, name=f"{name}/work")
        try:
            task = self._group.create_task(_guarded(name, work, self.grace_s), name=name)
        except BaseException:  # the group is already stopping
            work.cancel()
            raise
        task.add_done_callback(lambda _: work.cancel())  # a guard cancelled before it ran
        return task

    async def cancel(self, task: asyncio.Task[None]) -> None:
        """Cancel one task and wait (at most its grace) until it has ended; the others keep running."""
        task.cancel()
        await asyncio.wait({task})  # never raises the task's error: a failure is the group's to report


async def _guarded(name: str, inner: asyncio.Future[None], grace_s: float) -> None:
    """Wait for ``inner``; when cancelled, cancel it and wait at most ``grace_s`` for it to end."""
    try:
        await asyncio.shield(inner)
    except asyncio.CancelledError:
        if not inner.done():
            inner.cancel()
            done, _ = await asyncio.wait({inner}, timeout=grace_s)
            if not done:
                logger.warning("task %s did not stop within %.1f s; leaving it behind", name, grace_s)
            elif not inner.cancelled() and inner.exception() is not None:
                logger.error("task %s failed while stopping", name, exc_info=inner.exception())
        raise
    except Exception as e:
        logger.exception("task %s failed", name)
        raise TaskFailed(name, e) from e


async def supervise(
    tasks: Mapping[str, Coroutine[Any, Any, None]],
    *,
    until: asyncio.Event | None = None,
    grace_s: float = DEFAULT_GRACE_S,
) -> None:
    """Run the named coroutines until all have returned or ``until`` is set, then cancel what is left.

    A task that raises cancels the others and ``TaskFailed`` is raised, naming it. Cancelling
    ``supervise`` itself cancels every task (each within ``grace_s``)."""
    async with Supervisor(grace_s) as group:
        running = [group.start(name, coro) for name, coro in tasks.items()]
        if until is None:
            return  # leaving the block waits for all of them
        stop = asyncio.ensure_future(until.wait())
        try:
            pending: set[asyncio.Future[Any]] = set(running)
            while pending and not stop.done():
                _, pending = await asyncio.wait(pending | {stop}, return_when=asyncio.FIRST_COMPLETED)
                pending.discard(stop)
        finally:
            stop.cancel()
        for task in running:
            task.cancel()


@contextmanager
def stop_on_signals(
    event: asyncio.Event | None = None,
    signals: tuple[signal.Signals, ...] = STOP_SIGNALS,
    again: asyncio.Event | None = None,
) -> Iterator[asyncio.Event]:
    """Within the block, SIGINT and SIGTERM set ``event`` (a new one if not given) instead of killing
    the process, and a second one sets ``again`` (a stop that may take a while is cut short: Ctrl-C
    twice); the handlers that were there before come back when the block ends. Needs a running loop in
    the main thread."""
    loop = asyncio.get_running_loop()
    stop = event if event is not None else asyncio.Event()
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set() and again is not None:
            logger.warning("received %s again; stopping now", sig.name)
            again.set()
            return
        logger.info("received %s; stopping", sig.name)
        stop.set()

    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            if handler is not None:  # None: installed outside Python; remove_signal_handler reset it
                signal.signal(sig, handler)


def awaiting(coro: object) -> list[FrameType]:
    """The frames of ``coro`` and of what it awaits, outermost first (a suspended task's own stack holds
    only its outer frame; the chain of awaits says where it really waits)."""
    frames: list[FrameType] = []
    while coro is not None and len(frames) < 64:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            frames.append(frame)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return frames


@contextmanager
def dump_tasks_on(sig: signal.Signals = signal.SIGUSR1) -> Iterator[None]:
    """Within the block, ``sig`` logs at WARNING what every asyncio task of the loop is waiting on (its
    innermost frames): ``kill -USR1 <pid>`` shows where a process that seems stuck is, without stopping
    it. Needs a running loop in the main thread."""
    loop = asyncio.get_running_loop()

    def dump() -> None:
        tasks = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
        logger.warning("%s: %d asyncio task(s)", sig.name, len(tasks))
        for task in tasks:
            where = " > ".join(
                f"{f.f_code.co_name} ({Path(f.f_code.co_filename).name}:{f.f_lineno})"
                for f in awaiting(task.get_coro())[-DUMP_FRAMES:]
            )
            logger.warning("task %s: %s", task.get_name(), where or "(finished)")

    loop.add_signal_handler(sig, dump)
    try:
        yield
    finally:
        loop.remove_signal_handler(sig)


async def bounded(aw: Awaitable[T], seconds: float, what: str) -> T:
    """Await ``aw`` for at most ``seconds``; on timeout cancel it and raise ``DeadlineExceeded``
    (a ``TimeoutError``) that names ``what``."""
    deadline = asyncio.timeout(seconds)
    try:
        async with deadline:
            return await aw
    except TimeoutError:
        if not deadline.expired():  # a timeout of the awaited work itself, not ours: keep it as it is
            raise
        raise DeadlineExceeded(f"{what} did not finish within {seconds:.1f} s") from None
