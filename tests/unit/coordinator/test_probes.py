"""The coordinator's sweep of a failed plan's peers (the dial itself is replaced by a table here; the
real one is ``net/dial.reachable``, exercised over p2pd in tests/integration/net)."""

import asyncio

import pytest

from potluck.coordinator import probes
from potluck.coordinator.job.progress import JobProgress
from tests.unit.coordinator.job.test_progress import PLAN, STATE, P, rec


def test_a_failed_plans_silent_dead_peer_is_found_by_one_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c, d = P
    dialled: list[str] = []

    async def reachable(p2p: object, p: str, maddrs: object, timeout_s: float) -> bool:
        dialled.append(p)
        return p != c  # c was killed

    def sweep(progress: JobProgress, swept: set[int]) -> list[str]:
        return asyncio.run(probes.sweep_failed_plan(None, STATE, progress, PLAN, swept, 1.0))  # type: ignore[arg-type]

    monkeypatch.setattr(probes, "reachable", reachable)
    progress, swept = JobProgress(), set[int]()
    progress.update(PLAN, [rec(a, 7), rec(b, 7), rec(c, 7)])
    assert sweep(progress, swept) == [] and dialled == []  # nothing failed: nobody is dialled

    progress.update(PLAN, [rec(a, 7, state="failed")])  # the leader aborted, naming nobody
    assert sweep(progress, swept) == [c]
    assert sorted(dialled) == sorted([b, c, d])  # not the reporter
    pending, excluded = progress.verdicts(STATE, 2.0)
    assert excluded == [c] and pending == []  # confirmed by the probe: the re-plan leaves it out
    assert sweep(progress, swept) == [] and len(dialled) == 3  # once per failed epoch
