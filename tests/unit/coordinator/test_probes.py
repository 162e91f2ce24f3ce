"""The coordinator's sweep of a failed plan's peers (the dial itself is replaced by a table here; the
real one is ``net/dial.reachable``, exercised over p2pd in tests/integration/net)."""

import asyncio

import pytest

from potluck.coordinator import probes
from potluck.coordinator.job.progress import JobProgress
from potluck.coordinator.state import SwarmState
from potluck.protocol.training import Progress, StageAssignment, TrainPlan
from tests.unit.coordinator.job.test_plan import ids, peer


def record(pid: str, state: str, epoch: int = 3) -> Progress:
    return Progress(peer_id=pid, job="t", epoch=epoch, stage=0, replica=0, step=7, state=state, issued_at=1.0)  # type: ignore[arg-type]


def test_a_failed_plans_silent_dead_peer_is_found_by_one_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c, d = ids(4)
    dead = {c}
    dialled: list[str] = []

    async def reachable(p2p: object, p: str, maddrs: object, timeout_s: float) -> bool:
        dialled.append(p)
        return p not in dead

    monkeypatch.setattr(probes, "reachable", reachable)
    plan = TrainPlan(
        job="t",
        epoch=3,
        start_step=0,
        micro_batches=2,
        issued_at=1.0,
        stages=[
            StageAssignment(first_layer=0, last_layer=2, peers=[a, b]),
            StageAssignment(first_layer=2, last_layer=4, peers=[c, d]),
        ],
    )
    state = SwarmState("s", 1.0, {p: peer(p) for p in (a, b, c, d)})
    progress = JobProgress()
    progress.update(plan, [record(a, "training"), record(b, "training"), record(c, "training")])
    swept: set[int] = set()
    assert asyncio.run(probes.sweep_failed_plan(None, state, progress, plan, swept, 1.0)) == []  # type: ignore[arg-type]
    assert dialled == []  # nothing failed: nobody is dialled

    progress.update(plan, [record(a, "failed")])  # the leader aborted, naming nobody
    assert asyncio.run(probes.sweep_failed_plan(None, state, progress, plan, swept, 1.0)) == [c]  # type: ignore[arg-type]
    assert sorted(dialled) == sorted([b, c, d])  # not the reporter
    pending, excluded = progress.verdicts(state, 2.0)
    assert excluded == [c] and pending == []  # confirmed by the probe: the re-plan leaves it out
    assert asyncio.run(probes.sweep_failed_plan(None, state, progress, plan, swept, 1.0)) == []  # type: ignore[arg-type]
    assert len(dialled) == 3  # once per failed epoch
