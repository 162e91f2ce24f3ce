"""Co-location: a peer that declares two slots may host two replicas or two stages, run tick-tock.

A two-slot peer becomes two virtual devices (slot 0 keeps the peer's id, slot 1 is ``"<id>#1"``),
joined by a device-local link, and the ordinary search places them; ``plan_colocated`` plans with and
without the extra slots and keeps the faster plan, so a slot is used only where it pays.

What a slot is worth comes from the co-location profile the peer measured (``SlotProfile``):

- Compute is shared: each slot runs at ``tflops * pair_speedup / 2``, where ``pair_speedup`` is the
  throughput of two waves over one wave's on that device (scripts/bench_tick_tock.py measures it; 1.0
  means co-location gains nothing, 2.0 that the device had room for a second wave's compute).
- Memory: both slots hold their own weights, gradients and optimizer state (S per layer), and their
  activations (A per layer per micro-batch in flight) peak together at ``peak_ratio`` (C(d*) / one
  wave's peak, 1..2) of two waves' sum halved. A slot gets the memory that makes the step model's own
  check (``L (S + A k) + E <= slot``) imply the device's true one (``2 (L S + E) + r L A k <= M``):
  ``slot = f M/2 - (f - 1) E_max`` with ``f = (S + A) / (S + r A / 2)`` (k >= 1, E the embedding
  state). Two different stages on one device are costed with the same ``peak_ratio``: an estimate.

Approximations, all in the safe direction except the last: the local link is priced at the peer's
access caps where it declared them (directed_bandwidth caps every pair by them); a slot used without
its sibling still computes at the shared rate; and two slots that both sync with remote replicas send
over one uplink, which the model does not add up. Pure and deterministic like the rest of placement.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from potluck.coordinator.errors import PlanningError
from potluck.coordinator.placement.costmodel import GB, DeviceSpec, StepJob, layer_memory
from potluck.coordinator.placement.fresh import fresh_plan
from potluck.coordinator.placement.netmodel import NetModel
from potluck.coordinator.placement.types import (
    Job,
    PeerId,
    PlacementPlan,
    PlannerConfig,
    PlanningState,
)

logger = logging.getLogger(__name__)

LOCAL_GBPS = 1000.0  # a copy inside one device (Gbit/s): far above any network link
LOCAL_LATENCY_MS = 0.0


@dataclass(frozen=True)
class SlotProfile:
    """A peer's measured co-location profile (docs/ticktock.md)."""

    peak_ratio: float  # staggered combined activation peak / one wave's peak, in [1, 2]
    pair_speedup: float  # two waves' throughput / one wave's, in (0, 2]

    def __post_init__(self) -> None:
        if not (1.0 <= self.peak_ratio <= 2.0 and 0.0 < self.pair_speedup <= 2.0):
            raise PlanningError(
                f"slot profile out of range: peak_ratio {self.peak_ratio} (1..2), "
                f"pair_speedup {self.pair_speedup} (0..2]"
            )


def slot_id(peer: PeerId, slot: int) -> PeerId:
    """Slot 0 is the peer itself (a plan without co-location names the same ids); slot 1 is marked."""
    return peer if slot == 0 else f"{peer}#{slot}"


def slot_device(device: DeviceSpec, profile: SlotProfile, job: StepJob) -> DeviceSpec:
    """One of two slots of ``device``: shared compute, and the memory that keeps both slots' sum within
    the device (module docstring)."""
    state, act = layer_memory(job)
    r = profile.peak_ratio
    f = (state + act) / (state + r * act / 2.0)
    e_max = 2.0 * job.model.embed_params * job.bytes_per_param  # embedding and head: a 1-stage slot
    usable = device.memory_gb * GB * job.memory_headroom
    slot_usable = max(0.0, f * usable / 2.0 - (f - 1.0) * e_max)
    return DeviceSpec(device.tflops * profile.pair_speedup / 2.0, slot_usable / (GB * job.memory_headroom))


@dataclass(frozen=True)
class Colocated:
    """The state with every two-slot peer split in two, and who owns each virtual device."""

    state: PlanningState
    owner: Mapping[PeerId, tuple[PeerId, int]]  # virtual id -> (peer, slot)


def expand(state: PlanningState, slots: Mapping[PeerId, SlotProfile], job: StepJob) -> Colocated:
    """Split each peer of ``slots`` (those that declared two and measured a profile) into two slots."""
    ix: list[int] = []
    ids: list[PeerId] = []
    devices: list[DeviceSpec] = []
    owner: dict[PeerId, tuple[PeerId, int]] = {}
    for k, (peer, device) in enumerate(zip(state.peers, state.devices, strict=True)):
        profile = slots.get(peer)
        count = 2 if profile is not None else 1
        for s in range(count):
            ix.append(k)
            ids.append(slot_id(peer, s))
            devices.append(device if profile is None else slot_device(device, profile, job))
            owner[ids[-1]] = (peer, s)
    net = state.net.subset(ix)
    same = np.asarray(ix)[:, None] == np.asarray(ix)[None, :]
    np.fill_diagonal(same, False)
    lat = np.where(same, LOCAL_LATENCY_MS, net.latency_ms)
    bw = np.where(same, LOCAL_GBPS, net.bandwidth_gbps)
    measured = net.measured | same
    np.fill_diagonal(lat, 0.0)
    expanded = NetModel(lat, bw, measured, net.upload_gbps, net.download_gbps)
    return Colocated(PlanningState(tuple(ids), tuple(devices), expanded), owner)


def colocated_peers(plan: PlacementPlan, owner: Mapping[PeerId, tuple[PeerId, int]]) -> dict[PeerId, int]:
    """Peers that run more than one slot of ``plan``, with how many."""
    counts: dict[PeerId, int] = {}
    for row in plan.stages:
        for vid in row:
            peer = owner.get(vid, (vid, 0))[0]
            counts[peer] = counts.get(peer, 0) + 1
    return {p: n for p, n in counts.items() if n > 1}


def plan_colocated(
    state: PlanningState,
    job: Job,
    now: float,
    slots: Mapping[PeerId, SlotProfile],
    cfg: PlannerConfig | None = None,
) -> tuple[PlacementPlan | None, str, Mapping[PeerId, tuple[PeerId, int]]]:
    """A fresh plan that may use second slots: (plan, reason, virtual id -> (peer, slot)). Planned both
    ways, each with the whole time limit; the lower predicted step time wins (the plain plan on ties)."""
    cfg = cfg or PlannerConfig()
    plain, reason = fresh_plan(state, job, cfg)
    identity = {p: (p, 0) for p in state.peers}
    if not slots or not isinstance(job, StepJob):
        return _stamp(plain, now), reason, identity
    two, why, owner = colocated_attempt(state, job, slots, cfg)
    if two is not None and (plain is None or two.cost < plain.cost * (1.0 - 1e-9)):
        logger.info("plan: %s", why)
        return _stamp(two, now), why, owner
    return _stamp(plain, now), f"{reason}; second slots did not pay", identity


def colocated_attempt(
    state: PlanningState, job: StepJob, slots: Mapping[PeerId, SlotProfile], cfg: PlannerConfig
) -> tuple[PlacementPlan | None, str, Mapping[PeerId, tuple[PeerId, int]]]:
    """The best fresh plan over the state with second slots: (plan, reason, virtual id -> (peer, slot));
    ``detail["colocated"]`` names the peers it puts two slots on."""
    co = expand(state, slots, job)
    two, reason = fresh_plan(co.state, job, cfg)
    if two is None:
        return None, reason, co.owner
    shared = colocated_peers(two, co.owner)
    two.detail["colocated"] = sorted(str(p) for p in shared)
    return two, f"{reason}; co-located on {len(shared)} peer(s) (tick-tock)", co.owner


def _stamp(plan: PlacementPlan | None, now: float) -> PlacementPlan | None:
    if plan is not None:
        plan.detail["planned_at"] = now
    return plan
