"""Asking holders again while they settle (``transfer.copy.settled``): when to wait, when to give up."""

import asyncio

import pytest

from potluck.transfer.copy import SETTLE_MAX_WAIT_S, settled
from potluck.transfer.errors import StateError


def _flaky(errors: list[StateError]):
    calls = {"n": 0}

    async def fetch() -> str:
        calls["n"] += 1
        if errors:
            raise errors.pop(0)
        return "state"

    return fetch, calls


def test_holders_without_the_step_yet_are_asked_again_until_they_have_it():
    fetch, calls = _flaky([StateError("no state yet"), StateError("no state yet")])
    assert asyncio.run(settled(fetch, 10.0, "test")) == "state"
    assert calls["n"] == 3


def test_only_dead_holders_end_the_wait_at_once():
    fetch, calls = _flaky([StateError("refused", unreachable={"dead"})])
    with pytest.raises(StateError) as caught:
        asyncio.run(settled(fetch, 10.0, "test"))
    assert caught.value.unreachable == {"dead"} and calls["n"] == 1


def test_a_dead_holder_beside_a_settling_one_does_not_end_the_wait():
    fetch, calls = _flaky([StateError("refused / not yet", unreachable={"dead"}, settling=True)])
    assert asyncio.run(settled(fetch, 10.0, "test")) == "state"
    assert calls["n"] == 2


def test_the_wait_ends_within_settle_s():
    fetch, _ = _flaky([StateError("no state yet")] * 100)
    loop_time = asyncio.run(_timed(settled(fetch, 0.5, "test")))
    assert loop_time < 0.5 + SETTLE_MAX_WAIT_S


async def _timed(coro) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(StateError):
        await coro
    return loop.time() - start
