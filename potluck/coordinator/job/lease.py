"""A job's view of the swarm under an allocation (several jobs on one swarm, docs/multijob.md). Pure.

A job plans only over the peers its lease names. Peers its running plan places but the lease no longer
names are treated like peers leaving gracefully (``next_action`` -> "leave"): they still hold the
job's state and train on to the hand-off step of the job's next plan, so moving to another job loses
no committed step of this one. When the peers left to it are too few to plan with, the job pauses
(``pause_reason``, ``paused_action``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from potluck.coordinator.allocation.classes import is_cotenant
from potluck.coordinator.job.handoff import handoff_step
from potluck.coordinator.state import SwarmState
from potluck.protocol.allocation import Allocation
from potluck.protocol.training import TrainPlan


def leased_state(
    swarm: SwarmState,
    allocation: Allocation | None,
    job: str,
    plan: TrainPlan | None,
    home: bool = True,
) -> SwarmState:
    """``swarm`` as ``job`` may use it: the peers leased to the job, with its plan's other peers listed as
    leaving. Without an allocation in force, the swarm's own job (``home``) has every peer, and a job
    added to the swarm none (its first plan waits for its first lease). A co-tenant (a second peer on a
    shared device, ``PeerRecord.cotenant_of``) serves only a job its lease names: never otherwise."""
    if allocation is None and home:
        cotenants = [p for p, seen in swarm.peers.items() if is_cotenant(seen.record)]
        return swarm.without(cotenants) if cotenants else swarm
    mine = set(allocation.peers_of(job)) if allocation is not None else set()
    others = [p for p in swarm.peers if p not in mine]
    placed = set(plan.peers) if plan is not None and plan.status == "training" else set()
    view = swarm.without(others)
    moving = {p for p in others if p in placed}
    return replace(view, leaving=swarm.leaving | frozenset(moving))


def job_scale(min_peers: int, stages: int | None, replicas: int | None) -> int:
    """The peers a job asks the allocator for at once: its ``min_peers``, and at least the shape its
    limits fix (stages x replicas, one of them defaulting to 1)."""
    if stages is None and replicas is None:
        return min_peers
    return max(min_peers, (stages or 1) * (replicas or 1))


def pause_reason(state: SwarmState, plan: TrainPlan | None, min_peers: int, leased: bool) -> str | None:
    """Why to pause the job now, or None. Under an allocation (``leased``), a training plan whose lease
    moved placed peers away (they are listed leaving) while fewer than ``min_peers`` others remain cannot
    be re-planned without them: it pauses instead (``TrainPlan.stop_at``), so its peers stop together at
    a step, each with a checkpoint of it, and go; the job resumes from that checkpoint when its lease
    gives it enough peers again. No committed step is lost."""
    if not leased or plan is None or plan.status != "training" or plan.stop_at is not None:
        return None
    moving = [p for p in plan.peers if p in state.leaving]
    staying = [p for p in state.peers if p not in state.leaving]
    if not moving or len(staying) >= min_peers:
        return None
    return (
        f"the lease moves {len(moving)} placed peer(s) away and {len(staying)} of the {min_peers} "
        "the job needs remain"
    )


def paused_action(
    state: SwarmState, plan: TrainPlan, min_peers: int, reached: Mapping[str, int]
) -> tuple[str, str]:
    """What a paused job (``plan.stop_at`` set) does: ("plan", why) once its lease gives it ``min_peers``
    usable peers and every placed peer still live reached the stop step (``reached``: peer ->
    newest step it reported), else ("wait", why)."""
    assert plan.stop_at is not None
    usable = [p for p in state.peers if p not in state.leaving]
    if len(usable) < min_peers:
        return "wait", f"paused after step {plan.stop_at}: {len(usable)} of {min_peers} peers leased"
    # the leavers too: they stop at the pause, with their checkpoint, before they go (peer/worker.py)
    live = set(state.peers) | set(state.leaving)
    behind = [p for p in plan.peers if p in live and reached.get(p, -1) < plan.stop_at]
    if behind:
        return "wait", f"pausing after step {plan.stop_at}: {len(behind)} placed peer(s) not there yet"
    return "plan", f"resuming from the pause at step {plan.stop_at}: {len(usable)} peers leased"


def pause_step(reported: int, step_s: float, lead_s: float, steps: int, sync_every: int) -> int | None:
    """The step a pause stops after: the hand-off step (``handoff.handoff_step``: far enough ahead for the
    re-published plan to reach every peer), rounded up to a DiLoCo sync (replicas agree at syncs only).
    None when that is the job's last steps: it finishes instead."""
    at, _ = handoff_step(reported, step_s, lead_s, steps, sync_every)
    return at if at < steps - 1 else None
