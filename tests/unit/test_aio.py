"""potluck.aio on a real event loop: named tasks, a crash that stops the rest, bounded cancellation,
signals sent to this very process, and bounded waits."""

import asyncio
import logging
import os
import signal
import time

import pytest

from potluck.aio import Supervisor, bounded, dump_tasks_on, stop_on_signals, supervise
from potluck.errors import DeadlineExceeded, PotluckError, TaskFailed


async def _forever(log: list[str], name: str) -> None:
    try:
        await asyncio.sleep(3600)
    finally:
        log.append(f"{name} stopped")


def test_all_tasks_run_to_their_end():
    done: list[str] = []

    async def work(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        done.append(name)

    asyncio.run(supervise({"a": work("a", 0.02), "b": work("b", 0.01)}))
    assert done == ["b", "a"]


def test_a_crash_is_logged_by_name_and_stops_the_others(caplog):
    stopped: list[str] = []

    async def crash() -> None:
        await asyncio.sleep(0.01)
        raise KeyError("lost-layer")

    async def main() -> None:
        await supervise({"heartbeat": _forever(stopped, "heartbeat"), "train": crash()})

    with caplog.at_level(logging.ERROR, logger="potluck.aio"), pytest.raises(TaskFailed) as info:
        asyncio.run(main())
    assert info.value.task == "train" and "KeyError" in str(info.value) and "lost-layer" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)
    assert isinstance(info.value, PotluckError)
    assert stopped == ["heartbeat stopped"]
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "train" in record.getMessage() and record.exc_info is not None  # name and traceback


def test_until_stops_every_task():
    stopped: list[str] = []

    async def main() -> None:
        until = asyncio.Event()
        asyncio.get_running_loop().call_later(0.02, until.set)
        await supervise({"a": _forever(stopped, "a"), "b": _forever(stopped, "b")}, until=until)

    asyncio.run(main())
    assert sorted(stopped) == ["a stopped", "b stopped"]


def test_a_task_that_will_not_stop_is_left_behind_after_its_grace(caplog):
    async def stubborn() -> None:
        while True:  # swallows cancellation, as a buggy cleanup might
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    async def main() -> float:
        until = asyncio.Event()
        until.set()
        start = time.monotonic()
        await supervise({"stubborn": stubborn()}, until=until, grace_s=0.1)
        elapsed = time.monotonic() - start
        for task in asyncio.all_tasks() - {asyncio.current_task()}:  # let the loop close
            task.get_coro().close()  # type: ignore[union-attr]
        return elapsed

    with caplog.at_level(logging.WARNING, logger="potluck.aio"):
        elapsed = asyncio.run(main())
    assert elapsed < 1.0
    assert any("stubborn" in r.getMessage() and "0.1 s" in r.getMessage() for r in caplog.records)


def test_supervisor_cancels_one_task_and_keeps_the_rest():
    stopped: list[str] = []

    async def main() -> None:
        async with Supervisor(grace_s=1.0) as tasks:
            first = tasks.start("epoch-1", _forever(stopped, "epoch-1"))
            second = tasks.start("epoch-2", _forever(stopped, "epoch-2"))
            await asyncio.sleep(0.01)
            await tasks.cancel(first)
            assert first.done() and not second.done()
            assert stopped == ["epoch-1 stopped"]
            second.cancel()

    asyncio.run(main())
    assert stopped == ["epoch-1 stopped", "epoch-2 stopped"]


def test_the_blocks_own_error_comes_out_unwrapped():
    async def main() -> None:
        async with Supervisor() as tasks:
            tasks.start("idle", asyncio.sleep(3600))
            raise ValueError("bad config")

    with pytest.raises(ValueError, match="bad config"):
        asyncio.run(main())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_real_signal_sets_the_event_and_the_old_handlers_come_back(sig):
    async def main() -> tuple[object, object]:
        before = signal.getsignal(sig)
        with stop_on_signals() as stop:
            os.kill(os.getpid(), sig)
            await asyncio.wait_for(stop.wait(), timeout=5.0)
        return before, signal.getsignal(sig)

    before, after = asyncio.run(main())
    assert after is before


def test_stop_on_signals_sets_a_given_event():
    async def main() -> bool:
        event = asyncio.Event()
        with stop_on_signals(event) as stop:
            assert stop is event
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(event.wait(), timeout=5.0)
        return event.is_set()

    assert asyncio.run(main())


def test_bounded_returns_the_value_or_says_what_ran_out():
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert asyncio.run(bounded(answer(), 1.0, "the answer")) == 42
    with pytest.raises(DeadlineExceeded, match=r"withdrawing the heartbeat did not finish within 0\.1 s"):
        asyncio.run(bounded(asyncio.sleep(10), 0.1, "withdrawing the heartbeat"))
    with pytest.raises(TimeoutError):  # still a TimeoutError for callers that catch those
        asyncio.run(bounded(asyncio.sleep(10), 0.01, "x"))


def test_bounded_keeps_a_timeout_of_the_work_itself():
    async def own_timeout() -> None:
        raise TimeoutError("the peer's own deadline")

    with pytest.raises(TimeoutError, match="own deadline") as info:
        asyncio.run(bounded(own_timeout(), 5.0, "x"))
    assert not isinstance(info.value, DeadlineExceeded)


def test_a_second_signal_sets_the_again_event():
    """Ctrl-C twice: the first asks for a graceful stop, the second for a quick one."""

    async def main() -> tuple[bool, bool]:
        stop, again = asyncio.Event(), asyncio.Event()
        with stop_on_signals(stop, again=again):
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(stop.wait(), timeout=5.0)
            first = again.is_set()
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.wait_for(again.wait(), timeout=5.0)
        return first, again.is_set()

    assert asyncio.run(main()) == (False, True)


def test_sigusr1_logs_where_every_task_waits(caplog):
    async def parked(ev: asyncio.Event) -> None:
        await ev.wait()

    async def main() -> None:
        ev = asyncio.Event()
        task = asyncio.create_task(parked(ev), name="parked-task")
        await asyncio.sleep(0)
        with dump_tasks_on(signal.SIGUSR1):
            os.kill(os.getpid(), signal.SIGUSR1)
            await asyncio.sleep(0.1)  # the handler runs on the loop
        ev.set()
        await task

    with caplog.at_level(logging.WARNING, logger="potluck.aio"):
        asyncio.run(main())
    line = next(r.getMessage() for r in caplog.records if "parked-task" in r.getMessage())
    assert "parked (test_aio.py" in line and "wait (locks.py" in line, line
