"""Co-location in the planner (issue 19): slots, their memory and compute, and when they pay."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from potluck.coordinator.errors import PlanningError
from potluck.coordinator.placement import PlannerConfig, PlanningState
from potluck.coordinator.placement.colocate import (
    LOCAL_GBPS,
    SlotProfile,
    colocated_peers,
    expand,
    plan_colocated,
    slot_device,
    slot_id,
)
from potluck.coordinator.placement.costmodel import (
    GB,
    BatchSpec,
    DeviceSpec,
    ModelShape,
    StepJob,
    layer_memory,
)
from potluck.coordinator.placement.netmodel import from_matrices

FAST = PlannerConfig(time_limit_s=0.2, bound_time_limit_s=0.0)
JOB = StepJob(ModelShape(8, 512, 8, 8000, 512), BatchSpec(32, 1), recompute=False)


def _state(n: int, tflops: float = 50.0, memory_gb: float = 24.0) -> PlanningState:
    lat = np.full((n, n), 20.0)
    np.fill_diagonal(lat, 0.0)
    return PlanningState(
        tuple(f"p{i}" for i in range(n)),
        tuple(DeviceSpec(tflops, memory_gb) for _ in range(n)),
        from_matrices(lat, np.full((n, n), 1.0)),
    )


def test_a_slot_shares_compute_and_its_memory_keeps_the_device_whole() -> None:
    dev = DeviceSpec(40.0, 16.0)
    prof = SlotProfile(peak_ratio=1.25, pair_speedup=1.6)
    slot = slot_device(dev, prof, JOB)
    assert slot.tflops == pytest.approx(32.0)
    assert dev.memory_gb / 2 < slot.memory_gb < dev.memory_gb  # staggering buys memory over a half
    state, act = layer_memory(JOB)
    e_max = 2.0 * JOB.model.embed_params * JOB.bytes_per_param
    usable_slot = slot.memory_gb * GB * JOB.memory_headroom
    usable_dev = dev.memory_gb * GB * JOB.memory_headroom
    # wherever the step model's per-slot check passes, two such slots fit the device at the stagger
    for layers, k, e in itertools.product(range(1, 9), range(1, 9), (0.0, e_max / 2, e_max)):
        if layers * (state + act * k) + e <= usable_slot:
            assert 2 * (layers * state + e) + prof.peak_ratio * layers * act * k <= usable_dev * (1 + 1e-12)
    # no stagger benefit (r = 2): exactly half the device
    assert slot_device(dev, SlotProfile(2.0, 1.0), JOB).memory_gb == pytest.approx(8.0)


def test_profiles_out_of_range_are_refused() -> None:
    with pytest.raises(PlanningError):
        SlotProfile(0.9, 1.5)
    with pytest.raises(PlanningError):
        SlotProfile(1.3, 2.5)


def test_expand_splits_two_slot_peers_with_a_local_link() -> None:
    state = _state(3)
    co = expand(state, {"p1": SlotProfile(1.25, 1.6)}, JOB)
    assert co.state.peers == ("p0", "p1", "p1#1", "p2")
    assert co.owner["p1#1"] == ("p1", 1) and co.owner["p1"] == ("p1", 0) and slot_id("p1", 1) == "p1#1"
    net = co.state.net
    assert net.bandwidth_gbps[1, 2] == LOCAL_GBPS and net.latency_ms[1, 2] == 0.0
    assert net.latency_ms[0, 2] == net.latency_ms[0, 1] == 20.0
    assert co.state.devices[0] == state.devices[0] and co.state.devices[2].tflops == pytest.approx(40.0)


def test_second_slots_are_used_when_they_pay_and_not_otherwise() -> None:
    state = _state(2)
    fast = {p: SlotProfile(1.25, 1.8) for p in state.peers}
    plan, reason, owner = plan_colocated(state, JOB, 0.0, fast, FAST)
    assert plan is not None, reason
    shared = colocated_peers(plan, owner)
    assert shared and "tick-tock" in reason
    assert plan.detail["colocated"] == sorted(shared)
    plain = plan_colocated(state, JOB, 0.0, {}, FAST)[0]
    assert plain is not None and plan.cost < plain.cost
    # no compute gain: half-speed slots never beat the whole device
    slow = {p: SlotProfile(1.25, 1.0) for p in state.peers}
    plain, why, owner = plan_colocated(state, JOB, 0.0, slow, FAST)
    assert plain is not None and not colocated_peers(plain, owner)
    assert "did not pay" in why


def test_no_slots_is_the_plain_plan_and_deterministic() -> None:
    state = _state(4)
    a, _, owner = plan_colocated(state, JOB, 1.0, {}, FAST)
    b, _, _ = plan_colocated(state, JOB, 1.0, {}, FAST)
    assert a is not None and b is not None and a.stages == b.stages
    assert all(owner[p] == (p, 0) for p in state.peers)
