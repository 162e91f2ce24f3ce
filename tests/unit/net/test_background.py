"""Background traffic (net/pace.py, ``Background``): an overlapped outer sync's messages go after the
foreground's queue has drained and at a share of the uplink; foreground messages never wait, and once
someone waits for the sync its rest goes at full speed. A fake clock that sleeping advances."""

from __future__ import annotations

import asyncio

import pytest

from potluck.net import pace
from potluck.net.pace import Background
from potluck.net.tags import Phase, Round

OUTER = Round(0, 7, Phase.OUTER)
STEP = Round(0, 8, Phase.STEP)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        self.now += delay


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(pace.asyncio, "sleep", c.sleep)
    return c


def background(clock: Clock, uplink: float | None = 100_000.0) -> Background:
    bg = Background(share=0.5, clock=clock)
    bg.uplink = lambda: uplink  # bytes/s
    bg.mark(OUTER.attempts())
    return bg


def test_the_background_waits_for_the_foreground_queue_then_goes_at_the_share(clock: Clock) -> None:
    bg = background(clock)

    async def main() -> list[float]:
        await bg.wait(STEP.pack(), 30_000)  # the pipeline's: 0.3 s of the uplink, never waits
        sent = []
        for _ in range(3):
            await bg.wait(OUTER.pack(), 10_000)  # 0.2 s each at half the uplink
            sent.append(clock.now)
        return sent

    sent = asyncio.run(main())
    assert sent == pytest.approx([100.3, 100.5, 100.7])  # after the 0.3 s queue, then spaced 0.2 s
    assert clock.slept[0] == pytest.approx(0.3)


def test_foreground_messages_never_wait(clock: Clock) -> None:
    bg = background(clock)

    async def main() -> None:
        for _ in range(5):
            await bg.wait(STEP.pack(), 1 << 20)

    asyncio.run(main())
    assert clock.slept == []


def test_unmarked_or_without_a_known_uplink_nothing_waits(clock: Clock) -> None:
    unknown = background(clock, uplink=None)

    async def main() -> None:
        await unknown.wait(STEP.pack(), 1 << 20)
        await unknown.wait(OUTER.pack(), 1 << 20)  # the uplink is unknown: unpaced
        known = background(clock)
        await known.wait(STEP.pack(), 1 << 20)
        known.mark(None)  # someone waits for the sync: its rest goes at full speed
        await known.wait(OUTER.pack(), 1 << 20)

    asyncio.run(main())
    assert clock.slept == []
