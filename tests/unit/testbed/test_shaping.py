"""The shaper's bookkeeping (sleep durations captured, not timed)."""

import asyncio

import pytest

from potluck.testbed import shaping
from potluck.testbed.shaping import LinkShaper


@pytest.fixture
def sleeps(monkeypatch):
    got = []
    clock = [100.0]

    async def fake_sleep(s):
        got.append(s)

    monkeypatch.setattr(shaping.asyncio, "sleep", fake_sleep)
    monkeypatch.setattr(shaping.time, "monotonic", lambda: clock[0])
    return got


def test_serialization_on_shared_uplink_and_separate_links(sleeps):
    sh = LinkShaper(link_rate={("a", "b"): 100.0, ("a", "c"): 100.0}, up_rate={"a": 50.0})

    async def go():
        await sh.pace("a", "b", 100)  # uplink 50 B/s is the bottleneck: 2 s
        await sh.pace("a", "c", 100)  # waits for the uplink: starts at 2 s, ends at 4 s
        await sh.pace("x", "y", 10**9)  # unshaped pair: no wait

    asyncio.run(go())
    assert sleeps == [pytest.approx(2.0), pytest.approx(4.0)]


def test_downlink_of_receiver_is_shared_by_senders(sleeps):
    sh = LinkShaper(down_rate={"r": 10.0})

    async def go():
        await sh.pace("a", "r", 10)
        await sh.pace("b", "r", 10)

    asyncio.run(go())
    assert sleeps == [pytest.approx(1.0), pytest.approx(2.0)]
