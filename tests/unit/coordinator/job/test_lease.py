"""A job's view of the swarm under an allocation, and which job a peer serves (several jobs, one swarm)."""

import pytest
from pydantic import ValidationError

from potluck.cli.views.jobs import job_row
from potluck.coordinator.job.lease import job_scale, leased_state, pause_reason, pause_step, paused_action
from potluck.coordinator.job.progress import JobProgress, next_action
from potluck.coordinator.state import SwarmState
from potluck.peer.lease import HOME, keys_of, leased_job
from potluck.protocol.allocation import Allocation, ClassWorkers, Lease, RowShare
from potluck.protocol.identity import Identity
from potluck.protocol.keys import JobKeys
from potluck.protocol.training import StageAssignment, TrainPlan
from tests.unit.protocol.conftest import NOW, make_job
from tests.unit.protocol.test_membership import verified

IDS = [Identity.generate() for _ in range(4)]
P = [i.peer_id for i in IDS]


def swarm() -> SwarmState:
    return SwarmState.from_records("s", [verified(i, NOW + 10) for i in IDS], [], NOW)


def allocation(leases: dict[str, list[str]] | list[Lease], jobs: str = "ab") -> Allocation:
    """A round of leases on one class "cpu": one job's peers each (a dict), or the leases given, with a
    row for each of ``jobs``."""
    if isinstance(leases, dict):
        leases = [Lease(jobs=[j], peer_class="cpu", peers=ps) for j, ps in leases.items()]
    return Allocation(
        round=0,
        policy="max_min",
        lease_start=NOW,
        lease_end=NOW + 60,
        solved_at=NOW,
        classes=[ClassWorkers(peer_class="cpu", workers=4)],
        rows=[RowShare(jobs=[j], present_s=0.0) for j in jobs],
        leases=leases,
        issued_at=NOW,
    )


def plan(grid: list[list[str]], job: str = "a") -> TrainPlan:
    stages = [StageAssignment(first_layer=j, last_layer=j + 1, peers=row) for j, row in enumerate(grid)]
    return TrainPlan(job=job, epoch=1, start_step=0, stages=stages, micro_batches=1, issued_at=NOW)


def test_without_an_allocation_the_swarms_own_job_has_every_peer_and_an_added_job_none():
    assert set(leased_state(swarm(), None, "a", None).peers) == set(P)
    assert leased_state(swarm(), None, "b", None, home=False).peers == {}


def test_a_job_plans_over_its_leased_peers_and_hands_off_from_the_peers_it_loses():
    """Two of job a's four placed peers are leased to b: a sees them leaving gracefully, so it re-plans
    with a hand-off (the leavers train on to the new plan's start step), not a failure."""
    alloc = allocation({"a": P[:2], "b": P[2:]})
    running = plan([[P[0], P[2]], [P[1], P[3]]])
    view = leased_state(swarm(), alloc, "a", running)
    assert set(view.peers) == set(P[:2]) and view.leaving == {P[2], P[3]}
    action, why = next_action(view, make_job(name="a", min_peers=2), running, JobProgress(), NOW)
    assert action == "leave", why
    other = leased_state(swarm(), alloc, "b", None, home=False)
    assert set(other.peers) == set(P[2:]) and other.leaving == frozenset()
    # a peer that just left the swarm (not the lease) is no hand-off: it is gone
    assert P[3] not in leased_state(swarm().without([P[3]]), alloc, "a", running).peers


def test_a_job_asks_for_its_min_peers_and_at_least_the_shape_its_limits_fix():
    assert job_scale(2, None, None) == 2
    assert job_scale(2, 3, 2) == 6
    assert job_scale(8, 2, 2) == 8
    assert job_scale(2, 4, None) == 4 and job_scale(1, None, 3) == 3  # a fixed depth needs its peers


def test_a_peer_serves_the_job_its_lease_names_the_swarms_own_without_one_and_none_when_idle():
    alloc = allocation({"a": P[:2], "b": P[2:3]})
    assert leased_job(None, P[0], None) == HOME
    assert leased_job(alloc, P[0], "a") == HOME  # the swarm's own job keeps the swarm-level keys
    assert leased_job(alloc, P[2], "a") == JobKeys("b", home=False)
    assert leased_job(alloc, P[3], "a") is None
    assert keys_of("b", "a").plan == "b/plan" and keys_of("a", "a").plan == "plan"


def test_the_first_round_leaves_a_running_jobs_placed_peers_with_it():
    """Before any allocation, the swarm's own job's placed peers are its incumbents: the first round
    takes the job's lease from them and gives the newcomer job the others."""
    from potluck.coordinator.allocation import AllocConfig, JobDemand, PeerInfo, Throughput, allocate

    peers = [PeerInfo(p, peer_class="cpu") for p in P]
    rates = Throughput({("a", "cpu"): 1.0, ("b", "cpu"): 1.0})
    jobs = [JobDemand("a", scale=2), JobDemand("b", scale=2)]
    for placed in ([P[3], P[1]], [P[2], P[0]]):
        record, _ = allocate(NOW, jobs, peers, rates, AllocConfig(), None, {p: "a" for p in placed})
        assert set(record.peers_of("a")) == set(placed) and set(record.peers_of("b")) == set(P) - set(placed)


def test_a_job_left_with_too_few_peers_pauses_then_resumes_once_its_peers_stopped_and_enough_are_back():
    running = plan([[P[0], P[2]], [P[1], P[3]]])  # 2 x 2, min_peers 3
    # the lease moves two placed peers to b: two remain, fewer than three
    view = leased_state(swarm(), allocation({"a": P[:2], "b": P[2:]}), "a", running)
    why = pause_reason(view, running, 3, leased=True)
    assert why is not None and "2 of the 3" in why
    assert pause_reason(view, running, 2, leased=True) is None  # enough remain: an ordinary hand-off
    assert pause_reason(view, running, 3, leased=False) is None  # no allocation: no pauses
    paused = running.model_copy(update={"stop_at": 40})
    assert pause_reason(view, paused, 3, leased=True) is None  # paused already

    # paused: wait while too few are leased, and while placed peers (leavers too) have not stopped
    act, told = paused_action(view, paused, 3, {p: 40 for p in P})
    assert act == "wait" and "2 of 3 peers leased" in told
    back = leased_state(swarm(), allocation({"a": P[:3], "b": P[3:]}), "a", paused)
    act, told = paused_action(back, paused, 3, {P[0]: 40, P[1]: 40, P[2]: 40, P[3]: 38})
    assert act == "wait" and "1 placed peer(s) not there yet" in told  # P[3] still trains toward 40
    act, told = paused_action(back, paused, 3, {P[0]: 40, P[1]: 40, P[2]: 40, P[3]: 40})
    assert act == "plan" and "resuming from the pause at step 40" in told
    gone = leased_state(swarm().without([P[3]]), allocation({"a": P[:3]}), "a", paused)
    assert (
        paused_action(gone, paused, 3, {p: 40 for p in P[:3]})[0] == "plan"
    )  # a crashed leaver: not waited for


def test_the_pause_step_leads_the_swarm_rounds_up_to_a_sync_and_is_skipped_near_the_end():
    at = pause_step(100, step_s=0.5, lead_s=4.0, steps=1000, sync_every=1)
    assert at is not None and 100 < at <= 120  # ahead of the reported step by the plan's travel time
    synced = pause_step(100, step_s=0.5, lead_s=4.0, steps=1000, sync_every=8)
    assert synced is not None and synced % 8 == 0 and synced >= at
    assert pause_step(995, step_s=0.5, lead_s=4.0, steps=1000, sync_every=1) is None


def test_a_plan_without_a_pause_signs_the_bytes_older_versions_sign():
    running = plan([[P[0]], [P[1]]])
    assert b"stop_at" not in running.canonical_bytes()
    paused = running.model_copy(update={"stop_at": 7})
    assert b'"stop_at":7' in paused.canonical_bytes()
    assert TrainPlan.model_validate_json(paused.canonical_bytes()).stop_at == 7
    assert TrainPlan.model_validate_json(running.canonical_bytes()).stop_at is None
    with pytest.raises(ValidationError, match="before the plan's start step"):
        TrainPlan.model_validate({**running.model_dump(), "start_step": 10, "stop_at": 5})


def test_status_shows_a_paused_job_with_its_stop_step():
    running = plan([[P[0]], [P[1]]])
    assert job_row("a", running, [], None)["state"] == "training"
    assert (
        job_row("a", running.model_copy(update={"stop_at": 40}), [], None)["state"] == "paused after step 40"
    )
    assert job_row("a", None, [], None)["state"] == "waiting"
