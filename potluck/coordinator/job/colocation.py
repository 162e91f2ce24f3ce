"""Tick-tock in a job's plan: which peers may host two replicas' shares, and the plan that says so.

A peer that offers two slots (``Hardware.slots = 2``, with the pair speedup its start-up probe
measured) is planned as two virtual devices (``placement/colocate.py``). What a peer can run today is
two *waves of a whole-model replica* (``peer/train/waves.py``): each wave takes one data shard from
tokens to loss, so the co-located search is held to one stage, and a winning placement is folded back
into a ``TrainPlan`` that lists the peer once with ``waves = 2`` (two data shards) instead of naming a
virtual device. The all-reduce then runs over the real peers: the two-wave peer sends the sum of its
waves' gradients once.

Only jobs whose steps are synchronous and plainly averaged take part: local steps (DiLoCo) would make
two waves one replica with a double batch, the deadline policy could leave one wave's shard out, and
the robust rules judge each contribution as one replica's. Pure functions.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from potluck.coordinator.errors import PlanningError
from potluck.coordinator.placement import PlacementPlan, PlannerConfig, PlanningState
from potluck.coordinator.placement.colocate import SlotProfile, colocated_attempt, expand, slot_id
from potluck.coordinator.placement.costmodel import DeviceSpec, StepJob
from potluck.coordinator.placement.netmodel import NetModel
from potluck.coordinator.placement.types import PeerId
from potluck.coordinator.state import SwarmState
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import TrainPlan

logger = logging.getLogger(__name__)

# Staggered combined activation peak over one wave's, before the peer has measured its own: W1 on a
# 6-layer d = 192 stage measured 1.22-1.25 (docs/ticktock.md). The peer's admission check on its real
# profile has the last word: a pair that does not fit its --max-memory runs one wave after the other.
PEAK_RATIO_PRIOR = 1.25
# A two-slot peer that has not measured its pair speedup: a second wave gains nothing, so the planner
# uses the second slot only where the job cannot be planned without it (limits.replicas).
UNMEASURED_SPEEDUP = 1.0


def why_not(job: JobSpec) -> str | None:
    """Why the job cannot put two waves on one peer, or None when it can."""
    if job.compression.sync_every != 1:
        return "local steps (compression.sync_every > 1)"
    if job.sync.policy != "strict":
        return f"sync.policy = {job.sync.policy!r}"
    if job.trust.aggregation != "mean":
        return f"trust.aggregation = {job.trust.aggregation!r}"
    if job.limits.stages not in (None, 1):
        return f"limits.stages = {job.limits.stages} (waves run the whole model)"
    return None


def pair_speedups(state: SwarmState, peers: Sequence[str]) -> dict[str, float]:
    """The pair speedups the two-slot peers among ``peers`` measured (``Hardware.pair_speedup``)."""
    speedups = {p: state.peers[p].record.hardware.pair_speedup for p in peers}
    return {p: s for p, s in speedups.items() if s is not None}


def slot_profiles(state: SwarmState, peers: Sequence[str]) -> dict[PeerId, SlotProfile]:
    """The two-slot peers among ``peers``, each with its measured (or assumed) co-location profile."""
    measured = pair_speedups(state, peers)
    two = [p for p in peers if state.peers[p].record.hardware.slots == 2]
    return {p: SlotProfile(PEAK_RATIO_PRIOR, measured.get(p, UNMEASURED_SPEEDUP)) for p in two}


def colocated_placement(
    pstate: PlanningState,
    job: StepJob,
    slots: Mapping[PeerId, SlotProfile],
    cfg: PlannerConfig,
    plain: PlacementPlan | None,
) -> tuple[PlacementPlan, dict[str, int], str] | None:
    """A one-stage placement with second slots that beats ``plain`` (or exists where ``plain`` does
    not): (placement in real peer ids with per-peer wave counts folded out, peer -> waves, reason).
    None when second slots do not pay."""
    if not slots:
        return None
    two, why, owner = colocated_attempt(pstate, job, slots, replace(cfg, stages=1))
    if two is None or (plain is not None and two.cost >= plain.cost * (1.0 - 1e-9)):
        return None
    row, waves = fold(two.stages, owner)
    if max(waves.values()) < 2:
        return None  # the search left every second slot out
    placed = set(row)
    spares = tuple(dict.fromkeys(owner.get(v, (v, 0))[0] for v in two.spares if owner[v][0] not in placed))
    folded = replace(two, stages=(tuple(row),), spares=spares)
    return folded, waves, f"{why}; two waves on {sum(w == 2 for w in waves.values())} peer(s) (tick-tock)"


def fold(
    stages: Sequence[Sequence[PeerId]], owner: Mapping[PeerId, tuple[PeerId, int]]
) -> tuple[list[str], dict[str, int]]:
    """A one-stage placement over virtual devices as (real peers in first-seen order, peer -> waves)."""
    if len(stages) != 1:
        raise PlanningError(f"waves need a one-stage plan, the placement has {len(stages)} stages")
    waves: dict[str, int] = {}
    for vid in stages[0]:
        peer = str(owner.get(vid, (vid, 0))[0])
        waves[peer] = waves.get(peer, 0) + 1
    return list(waves), waves


def unfold(
    plan: TrainPlan,
    devices: Mapping[str, DeviceSpec],
    net: NetModel,
    order: Sequence[str],
    job: StepJob,
    speedups: Mapping[str, float],
) -> tuple[list[list[str]], dict[str, DeviceSpec], NetModel, list[str]]:
    """A plan with waves as the planner sees it: each two-wave peer as two slot devices (``speedups``:
    its measured pair speedup; missing: none) so the step model can price it. Returns (rows of peer
    ids per stage, devices, net, the net's row order)."""
    two = {p for st in plan.stages if st.waves for p, w in zip(st.peers, st.waves, strict=True) if w == 2}
    rows = [
        [v for p, w in zip(st.peers, st.waves or [1] * len(st.peers), strict=True) for v in _slots(p, w)]
        for st in plan.stages
    ]
    if not two:
        return rows, dict(devices), net, list(order)
    profiles: dict[PeerId, SlotProfile] = {
        p: SlotProfile(PEAK_RATIO_PRIOR, speedups.get(p, UNMEASURED_SPEEDUP)) for p in two
    }
    state = PlanningState(tuple(order), tuple(devices[p] for p in order), net)
    co = expand(state, profiles, job)
    ids = [str(v) for v in co.state.peers]
    return rows, dict(zip(ids, co.state.devices, strict=True)), co.state.net, ids


def _slots(peer: str, waves: int) -> list[str]:
    return [str(slot_id(peer, s)) for s in range(waves)]
