"""Serving policy and the coded fan-out: builders and workers by speed, decode from the first replies."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from potluck.classpar.assign import assign_builders, assign_workers, by_speed, tolerates_loss_of_any_peer
from potluck.classpar.code import group_parity, systematic_cauchy
from potluck.classpar.errors import CodeError
from potluck.classpar.fanout import first_decodable

SPEEDS = {"a": 1.0, "b": 4.0, "c": 2.0, "d": 0.1, "e": 2.0}


def test_builders_fastest_first_and_slow_peers_left_out() -> None:
    assert by_speed(SPEEDS) == ["b", "c", "e", "a", "d"]
    assert assign_builders(5, SPEEDS) == ["b", "c", "e", "a", "b"]  # d is below half the median (2.0)
    assert assign_builders(2, {"x": 0.1}) == ["x", "x"]


def test_heaviest_workers_on_fastest_peers_and_loss_tolerance() -> None:
    code = group_parity(4, 2)  # weights 1,1,1,1,2,2
    holders = assign_workers(code, SPEEDS)
    assert holders[4:] == ["b", "c"]
    assert holders[:4] == ["e", "a", "d", "b"]  # wraps round: b holds unit 3 and group 0's parity
    assert tolerates_loss_of_any_peer(code, holders)  # unit 3 is recovered by group 1's parity on c
    assert not tolerates_loss_of_any_peer(code, ["e", "a", "d", "b", "e", "c"])  # e: unit 0 and its parity
    cauchy = systematic_cauchy(4, 2)
    spread = assign_workers(cauchy, {f"p{i}": 1.0 for i in range(6)})
    assert len(set(spread)) == 6 and tolerates_loss_of_any_peer(cauchy, spread)


async def _reply(value: np.ndarray, delay: float, fail: bool = False) -> np.ndarray:
    await asyncio.sleep(delay)
    if fail:
        raise ConnectionError("peer gone")
    return value


def test_first_decodable_ignores_a_dead_and_a_hung_worker() -> None:
    code = systematic_cauchy(5, 2)
    scores = np.random.default_rng(0).random((5, 3))
    replies = code.encode(scores)
    delays = [0.01, 0.02, 3600.0, 0.03, 0.04, 0.05, 0.06]  # worker 2 hangs
    fails = [False, False, False, True, False, False, False]  # worker 3 is dead

    async def go() -> tuple[np.ndarray, list[int], float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        calls = [_reply(replies[j], delays[j], fails[j]) for j in range(code.n)]
        got, used = await first_decodable(code, calls, timeout_s=10.0)
        return got, used, loop.time() - t0

    got, used, took = asyncio.run(go())
    assert used == [0, 1, 4, 5, 6]
    assert np.abs(got - scores).max() <= 1e-12
    assert took < 5.0  # never waited for the hung worker


def test_first_decodable_times_out_when_too_few_answer() -> None:
    code = systematic_cauchy(3, 1)
    replies = code.encode(np.ones(3))

    async def go() -> None:
        calls = [_reply(replies[j], 0.0 if j < 2 else 3600.0) for j in range(4)]
        await first_decodable(code, calls, timeout_s=0.1)

    with pytest.raises(CodeError, match="only workers"):
        asyncio.run(go())
