"""Recomputation checks run on one worker thread at a lowered CPU priority."""

import asyncio
import os
import threading

import pytest

from potluck.peer.train.checks.idle import NICE, in_idle_time


def priority() -> tuple[int, int]:
    return threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="no thread priorities here")
def test_checks_run_on_one_thread_at_a_lowered_priority_and_leave_the_caller_alone():
    async def run() -> list[tuple[int, int]]:
        return [await in_idle_time(priority) for _ in range(3)]

    before = priority()
    seen = asyncio.run(run())
    assert {tid for tid, _ in seen} != {before[0]} and len({tid for tid, _ in seen}) == 1
    assert NICE > 0 and all(nice == max(NICE, before[1]) for _, nice in seen)
    assert priority() == before
