"""A job's view of the swarm under an allocation (several jobs on one swarm, docs/multijob.md). Pure.

A job plans only over the peers its lease names. Peers its running plan places but the lease no longer
names are treated like peers leaving gracefully (``next_action`` -> "leave"): they still hold the
job's state and train on to the hand-off step of the job's next plan, so moving to another job loses
no committed step of this one.
"""

from __future__ import annotations

from dataclasses import replace

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
    added to the swarm none (its first plan waits for its first lease)."""
    if allocation is None and home:
        return swarm
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
