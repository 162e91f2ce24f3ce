"""The coordinator's sweep of a failed plan's peers and its watch of its daemon's connections (the dial itself is replaced by a table here; the
real one is ``net/dial.reachable``, exercised over p2pd in tests/integration/net)."""

import asyncio
from types import SimpleNamespace

import pytest

from potluck.coordinator import probes
from potluck.coordinator.job.progress import JobProgress, next_action
from tests.unit.coordinator.job.test_plan import JOB
from tests.unit.coordinator.job.test_progress import PLAN, STATE, P, rec, swarm


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


class _Daemon:
    """The coordinator's p2pd as ``ConnectionWatch`` sees it: the peers it is connected to, per poll."""

    def __init__(self) -> None:
        self.connected: list[str] = []

    async def list_peers(self) -> list[object]:
        return [SimpleNamespace(peer_id=SimpleNamespace(to_base58=lambda p=p: p)) for p in self.connected]


def test_a_placed_peer_whose_connection_closes_and_that_refuses_a_dial_is_gone_before_its_heartbeat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b, c, d = P
    dialled: list[str] = []
    dead = {c}

    async def reachable(p2p: object, p: str, maddrs: object, timeout_s: float) -> bool:
        dialled.append(p)
        return p not in dead

    monkeypatch.setattr(probes, "reachable", reachable)
    daemon, watch, progress = _Daemon(), probes.ConnectionWatch(), JobProgress()
    progress.update(PLAN, [rec(p, 7) for p in P])

    def poll(*connected: str) -> list[str]:
        daemon.connected = list(connected)
        return asyncio.run(watch.poll(daemon, STATE, progress, PLAN, 1.0))  # type: ignore[arg-type]

    assert poll(a, b, c, d) == [] and dialled == []
    assert next_action(STATE, JOB, PLAN, progress, 8.0)[0] == "wait"
    # b's connection was trimmed (it answers the dial); c was killed (its connection reset, it refuses)
    assert poll(a, d) == [c] and sorted(dialled) == [b, c]
    action, why = next_action(STATE, JOB, PLAN, progress, 8.0)
    assert action == "replan" and c[:12] in why and b[:12] not in why, why  # its heartbeat has not expired
    assert progress.verdicts(STATE, 8.0)[1] == [c]  # and the re-plan leaves it out
    assert poll(a, b, d) == [] and len(dialled) == 2  # each loss is dialled once
    # a peer not placed (a spare) is never dialled, nor is anyone once the plan is done
    dead.add(d)
    assert asyncio.run(watch.poll(daemon, STATE, progress, None, 1.0)) == []  # type: ignore[arg-type]
    daemon.connected = [a]
    done = PLAN.model_copy(update={"status": "done"})
    assert asyncio.run(watch.poll(daemon, STATE, progress, done, 1.0)) == [] and len(dialled) == 2  # type: ignore[arg-type]


def test_a_peer_found_dead_that_heartbeats_again_is_placed_as_before() -> None:
    c = P[2]
    progress = JobProgress()
    progress.update(PLAN, [rec(p, 7) for p in P])
    state = swarm({p: 5.0 for p in P})  # everyone heartbeated at DHT time 5
    progress.confirm_gone(c, 10.0)
    assert next_action(state, JOB, PLAN, progress, 10.0)[0] == "replan"
    back = swarm({**{p: 5.0 for p in P}, c: 11.0})  # it restarted with the same key and heartbeated
    assert next_action(back, JOB, PLAN, progress, 11.0)[0] == "wait"
