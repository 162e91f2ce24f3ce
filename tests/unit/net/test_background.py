"""Background traffic (net/pace.py, ``Background``): an overlapped outer sync's messages wait for their
turn at a share of the uplink; every other message, and the sync's rest once someone waits for it, goes
at once."""

from __future__ import annotations

import asyncio

import pytest

from potluck.net import pace
from potluck.net.pace import Background
from potluck.net.tags import Phase, Round


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The delays the pacer asked for, instead of sleeping them."""
    asked: list[float] = []

    async def sleep(delay: float) -> None:
        asked.append(delay)

    monkeypatch.setattr(pace.asyncio, "sleep", sleep)
    return asked


def test_messages_of_the_marked_rounds_are_spaced_at_the_rate(sleeps: list[float]) -> None:
    outer = Round(0, 7, Phase.OUTER)
    bg = Background()
    bg.rate = lambda: 100_000.0  # bytes/s
    bg.mark(outer.attempts())

    async def main() -> None:
        for _ in range(3):
            await bg.wait(outer.pack(), 20_000)  # 0.2 s of the share each
        await bg.wait(Round(0, 8, Phase.STEP).pack(), 20_000)  # the pipeline's: never waits

    asyncio.run(main())
    # the first goes at once; each later one waits for the ones before it (within the test's own run time)
    assert len(sleeps) == 2
    assert sleeps[0] == pytest.approx(0.2, abs=0.05) and sleeps[1] == pytest.approx(0.4, abs=0.05)


def test_unmarked_or_without_a_known_uplink_nothing_waits(sleeps: list[float]) -> None:
    outer = Round(0, 7, Phase.OUTER)
    bg = Background()
    bg.mark(outer.attempts())  # no rate: the uplink is unknown

    async def main() -> None:
        await bg.wait(outer.pack(), 1 << 20)
        await bg.wait(outer.pack(), 1 << 20)
        bg.rate = lambda: 1000.0
        bg.mark(None)  # someone waits for the sync: its rest goes at full speed
        await bg.wait(outer.pack(), 1 << 20)
        await bg.wait(outer.pack(), 1 << 20)

    asyncio.run(main())
    assert sleeps == []
