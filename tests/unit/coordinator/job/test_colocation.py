"""Tick-tock in the coordinator's plan (issue 19): a two-slot peer gets two replicas' shares of a
one-stage plan where that is faster or the only way to the replicas the job asks for."""

from __future__ import annotations

import pytest

from potluck.coordinator.errors import PlanningError
from potluck.coordinator.job.colocation import fold, why_not
from potluck.coordinator.job.plan import JobPlanConfig, calibrated_tflops
from potluck.coordinator.job.plan import make_train_plan as plan_with
from potluck.coordinator.placement import PlannerConfig
from potluck.coordinator.state import SwarmState
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.membership import PeerView
from potluck.protocol.records import PeerRecord
from tests.unit.protocol.conftest import make_hardware

QUICK = JobPlanConfig(planner=PlannerConfig(time_limit_s=0.3, bound_time_limit_s=0.1))


def make_train_plan(state: SwarmState, j: JobSpec, now: float, epoch: int, start: int):  # type: ignore[no-untyped-def]
    return plan_with(state, j, now, epoch, start, cfg=QUICK)


def job(**over: object) -> JobSpec:
    base: dict[str, object] = {
        "name": "t",
        "min_peers": 2,
        "model": {"n_layers": 4, "d_model": 64, "n_heads": 4, "vocab_size": 256, "seq_len": 32},
        "batch": {"tokens_per_step": 32 * 24, "micro_batch_size": 2},
        "limits": {"stages": 1},
    }
    base.update(over)
    return JobSpec.model_validate(base)


def peer(pid: str, slots: int = 1, speedup: float | None = None) -> PeerView:
    hw = make_hardware(memory_free_bytes=8 << 30, tflops_fp32=0.1, tflops_bf16=0.1, slots=slots)
    hw = hw.model_copy(update={"pair_speedup": speedup})
    return PeerView(PeerRecord(peer_id=pid, hardware=hw, issued_at=100.0), expiration=200.0)


def swarm(two_slot: dict[str, float | None], plain: int) -> tuple[SwarmState, list[str]]:
    pids = sorted(Identity.generate().peer_id for _ in range(len(two_slot) + plain))
    speedups = list(two_slot.values())
    views = {p: peer(p, 2, speedups[k]) if k < len(speedups) else peer(p) for k, p in enumerate(pids)}
    return SwarmState("s", 100.0, views), pids


def test_the_only_plan_with_the_replicas_asked_for_gives_the_two_slot_peer_two_waves():
    state, pids = swarm({"a": None}, plain=1)
    plan, placement, reason = make_train_plan(state, job(limits={"stages": 1, "replicas": 3}), 100.0, 1, 0)
    assert plan is not None and placement is not None, reason
    (stage,) = plan.stages
    assert sorted(stage.peers) == sorted(pids) and stage.waves is not None
    assert dict(zip(stage.peers, stage.waves, strict=True)) == {pids[0]: 2, pids[1]: 1}
    assert plan.data_replicas == 3 and "tick-tock" in reason
    assert plan.predicted_step_s > 0 and not plan.spares


def test_without_a_second_slot_the_same_job_cannot_be_planned():
    state, _ = swarm({}, plain=2)
    plan, _, reason = make_train_plan(state, job(limits={"stages": 1, "replicas": 3}), 100.0, 1, 0)
    assert plan is None and reason


def test_a_measured_free_second_wave_is_used_and_an_unmeasured_one_is_not():
    fast, _ = swarm({"a": 2.0}, plain=1)
    plan, _, reason = make_train_plan(fast, job(), 100.0, 1, 0)
    assert plan is not None and plan.stages[0].waves is not None, reason
    slow, _ = swarm({"a": None}, plain=1)  # a pair at one wave's speed: each slot at half speed
    plan, _, reason = make_train_plan(slow, job(), 100.0, 1, 0)
    assert plan is not None and plan.stages[0].waves is None, reason


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"compression": {"sync_every": 4}}, "local steps"),
        ({"sync": {"policy": "deadline"}}, "deadline"),
        ({"trust": {"aggregation": "trimmed_mean"}}, "trimmed_mean"),
        ({"limits": {"stages": 2}}, "whole model"),
    ],
)
def test_jobs_whose_rules_do_not_fit_two_waves_keep_one_per_peer(over: dict[str, object], why: str):
    j = job(**over)
    assert why in (why_not(j) or "")
    state, _ = swarm({"a": 2.0}, plain=3)
    plan, _, reason = make_train_plan(state, j, 100.0, 1, 0)
    assert plan is not None and all(st.waves is None for st in plan.stages)
    assert "second slots unused" in reason and why in reason
    assert why_not(job()) is None


def test_fold_counts_slots_per_peer_and_refuses_pipelines():
    owner = {"A": ("A", 0), "A#1": ("A", 1), "B": ("B", 0)}
    assert fold([["B", "A", "A#1"]], owner) == (["B", "A"], {"B": 1, "A": 2})
    with pytest.raises(PlanningError, match="one-stage"):
        fold([["A"], ["A#1"]], owner)


def test_a_two_wave_peer_is_credited_with_two_shards_of_work():
    state, pids = swarm({"a": None}, plain=1)
    j = job(limits={"stages": 1, "replicas": 3})
    plan, _, _ = make_train_plan(state, j, 100.0, 1, 0)
    assert plan is not None and plan.stages[0].waves is not None
    two = plan.stages[0].peers[plan.stages[0].waves.index(2)]
    one = next(p for p in pids if p != two)
    speeds = calibrated_tflops(plan, j, {two: 1.0, one: 1.0})
    assert speeds[two] == pytest.approx(2 * speeds[one])  # 16 sequences a step against 8
