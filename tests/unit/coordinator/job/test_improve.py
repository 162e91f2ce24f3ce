"""Placing peers that joined a running job: the price of the move against the predicted gain (pure)."""

import pytest

from potluck.coordinator.job.improve import (
    ImproveConfig,
    JoinOffer,
    evaluate_join,
    full_reason,
    join_verdict,
    layer_state_bytes,
    move_seconds,
    newcomer_speeds,
)
from potluck.coordinator.job.joins import JoinDesk
from potluck.coordinator.job.plan import JobPlanConfig
from potluck.coordinator.placement import PlannerConfig
from potluck.coordinator.state import SwarmState
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.membership import PeerView
from potluck.protocol.records import LinkReport, LinkSample
from potluck.protocol.training import StageAssignment, TrainPlan
from tests.unit.coordinator.job.test_plan import ids, peer

FAST = JobPlanConfig(planner=PlannerConfig(time_limit_s=0.3, bound_time_limit_s=0.1))


def job(steps: int = 1000, max_replicas: int = 3) -> JobSpec:
    """One stage; 12 sequences a step in micro-batches of 2: 2 replicas run 3 each, 3 run 2 each."""
    return JobSpec.model_validate(
        {
            "name": "t",
            "steps": steps,
            "min_peers": 2,
            "model": {"n_layers": 4, "d_model": 256, "n_heads": 4, "vocab_size": 256, "seq_len": 64},
            "batch": {"tokens_per_step": 64 * 12, "micro_batch_size": 2},
            "limits": {"stages": 1, "max_replicas": max_replicas},
        }
    )


def one_stage(peers: list[str], epoch: int = 1) -> TrainPlan:
    return TrainPlan(
        job="t",
        epoch=epoch,
        start_step=0,
        micro_batches=3,
        issued_at=1.0,
        stages=[StageAssignment(first_layer=0, last_layer=4, peers=peers)],
    )


def offer(**kw: object) -> JoinOffer:
    base = dict(step=20, remaining_steps=500, current_s=0.3, new_s=0.2, move_s=1.0, placed=("c",))
    return JoinOffer(**(base | kw))  # type: ignore[arg-type]


def test_verdict_places_when_the_saving_beats_the_move_by_the_margin():
    cfg = ImproveConfig(restart_s=5.0, margin=1.5)
    decision, why = join_verdict(offer(), cfg)  # saves 50 s > 1.5 x 6 s
    assert decision == "improve" and "0.300 -> 0.200 s" in why and "move cost 6.0 s" in why
    decision, why = join_verdict(offer(remaining_steps=80), cfg)  # saves 8 s < 9 s
    assert decision == "keep" and why.startswith(
        "placed at a re-plan if it pays: predicted step 0.300 -> 0.200 s"
    )
    assert len(f"joined at step 123456; {why}") <= 128, why
    decision, why = join_verdict(offer(placed=(), full="the plan is full: limits.max_replicas=2"), cfg)
    assert decision == "keep" and why == "not placed: the plan is full: limits.max_replicas=2"
    decision, _ = join_verdict(offer(new_s=0.35), cfg)  # slower with it: never
    assert decision == "keep"


def test_move_cost_counts_only_peers_whose_layers_change_at_their_measured_link():
    a, b, c = ids(3)
    j = job()
    links = {c: LinkReport(peer_id=c, issued_at=1.0, links=[LinkSample(dst=a, rtt_ms=1, bandwidth_gbps=0.5)])}
    state = SwarmState("s", 1.0, {p: peer(p) for p in (a, b, c)}, links)
    old, new = one_stage([a, b]), one_stage([a, b, c], epoch=2)
    nbytes = layer_state_bytes(j, 0, 4)
    assert nbytes > layer_state_bytes(j, 1, 3) > 0
    assert abs(move_seconds(old, new, j, state, 1.0) - nbytes * 8 / 0.5e9) < 1e-9
    assert move_seconds(old, old, j, state, 1.0) == 0.0


def test_a_newcomer_runs_at_the_measured_pace_of_its_device_else_at_its_scaled_probe():
    a, b, c = ids(3)
    state = SwarmState("s", 1.0, {a: peer(a, tflops=1.0), b: peer(b, tflops=1.0), c: peer(c, tflops=0.2)})
    speeds = newcomer_speeds(state, {a: 0.1, b: 0.3}, [c])
    assert abs(speeds[c] - 0.2) < 1e-9 and speeds[a] == 0.1  # same device as a and b: their median
    other = peer(c, tflops=0.8)
    hw = other.record.hardware.model_copy(update={"device_name": "a faster cpu", "cpu_cores": 16})
    other = PeerView(other.record.model_copy(update={"hardware": hw}), other.expiration)
    state = SwarmState("s", 1.0, {a: peer(a, tflops=0.4), b: peer(b, tflops=0.4), c: other})
    speeds = newcomer_speeds(state, {a: 0.1, b: 0.1}, [c])
    assert abs(speeds[c] - 0.2) < 1e-9  # its probe, scaled like the swarm measured itself


def test_a_third_replica_is_placed_early_in_a_long_job_but_not_near_its_end_or_past_the_limits():
    a, b, c = ids(3)
    state = SwarmState("s", 1.0, {p: peer(p) for p in (a, b, c)})
    running = one_stage([a, b])
    ev = evaluate_join(state, job(), running, 20, {}, [c], 1.0, plan_cfg=FAST)
    assert ev.plan is not None and ev.plan.n_replicas == 3 and ev.offer.placed == (c,)
    assert ev.offer.new_s < ev.offer.current_s and ev.offer.move_s > 0
    assert join_verdict(ev.offer)[0] == "improve"
    real = evaluate_join(state, job(), running, 20, {}, [c], 1.0, plan_cfg=FAST, measured_s=2.0)
    assert real.offer.current_s == 2.0  # the model's ratio applied to the measured step
    assert abs(real.offer.new_s / 2.0 - ev.offer.new_s / ev.offer.current_s) < 1e-6
    near_end = evaluate_join(state, job(steps=22), running, 20, {}, [c], 1.0, plan_cfg=FAST)
    assert join_verdict(near_end.offer)[0] == "keep"
    full = evaluate_join(state, job(max_replicas=2), running, 20, {}, [c], 1.0, plan_cfg=FAST)
    decision, why = join_verdict(full.offer)
    assert decision == "keep" and "the plan is full: limits.max_replicas=2" in why
    assert full_reason(job(max_replicas=2), running).startswith("the plan is full")


@pytest.mark.slow  # the desk prices a join with the planner's 2 s search
def test_the_desk_names_newcomers_at_once_and_prices_them_at_most_every_check():
    a, b, c, d = ids(4)
    j = job()
    plan = one_stage([a, b])
    desk = JoinDesk(check_s=10.0, recheck_s=60.0)
    desk.new_plan(plan)
    assert desk.spares(plan, SwarmState("s", 1.0, {p: peer(p) for p in (a, b)}), j, 5) == []
    state = SwarmState("s", 1.0, {a: peer(a), b: peer(b), c: peer(c), d: peer(d, memory=1 << 10)})
    told = {s.peer_id: s.reason for s in desk.spares(plan, state, j, 7)}
    assert told[c] == "joined at step 7; checking whether placing it pays"
    assert "too little memory" in told[d] and desk.newcomers(plan, state, j) == [c]
    assert desk.due([c], 100.0)
    decision, reason, _ = desk.evaluate(state, j, plan, 7, {}, [c], 1.0, 100.0)
    assert decision == "improve", reason
    assert not desk.due([c], 105.0) and not desk.due([c], 120.0) and desk.due([c], 161.0)
    desk.new_plan(one_stage([a, b, c], epoch=2))
    assert desk.notes == {} and desk.base == []


def test_a_slow_replica_does_not_hide_the_gain_of_growing_the_running_shape():
    """One placed peer runs 3x slower (a busy machine): the newcomer is placed either as a third replica
    or in the slow peer's stead, whichever the model predicts faster; both beat the running plan."""
    a, b, c = ids(3)
    state = SwarmState("s", 1.0, {p: peer(p) for p in (a, b, c)})
    ev = evaluate_join(state, job(), one_stage([a, b]), 20, {a: 0.1 / 3, b: 0.1}, [c], 1.0, plan_cfg=FAST)
    assert ev.plan is not None and ev.offer.placed == (c,) and ev.offer.new_s < ev.offer.current_s
    assert join_verdict(ev.offer)[0] == "improve"


@pytest.mark.slow  # the desk prices a join with the planner's 2 s search
def test_a_spare_keeps_the_step_it_joined_at_and_hears_the_verdict():
    a, b, c = ids(3)
    j = job(steps=12)  # 5 steps left: placing it never pays
    plan = one_stage([a, b])
    desk = JoinDesk(check_s=0.0, recheck_s=0.0)
    desk.new_plan(plan)
    state = SwarmState("s", 1.0, {p: peer(p) for p in (a, b, c)})
    desk.spares(plan, state, j, 7)
    decision, _, _ = desk.evaluate(state, j, plan, 9, {}, [c], 1.0, 5.0)
    told = {s.peer_id: s.reason for s in desk.spares(plan, state, j, 9)}
    assert decision == "keep" and told[c].startswith("joined at step 7; placed at a re-plan if it pays")


def test_a_newcomers_claim_counts_for_at_most_cap_x_the_measured_median():
    a, b, c = ids(3)
    fast = peer(c, tflops=2000.0)
    hw = fast.record.hardware.model_copy(update={"device_kind": "cuda", "device_name": "a claimed GPU"})
    liar = PeerView(fast.record.model_copy(update={"hardware": hw}), fast.expiration)
    state = SwarmState("s", 1.0, {a: peer(a, tflops=0.1), b: peer(b, tflops=0.1), c: liar})
    assert newcomer_speeds(state, {a: 0.1, b: 0.1}, [c])[c] == 2000.0  # believed as probed
    assert newcomer_speeds(state, {a: 0.1, b: 0.1}, [c], cap=2.0)[c] == 0.2


def test_a_newcomer_is_not_swapped_for_an_equal_spare():
    """One placed peer runs 3x slower and the plan is full (2 replicas at most): a newcomer would be
    placed in its stead, but so would the spare already waiting, as fast. The gain is the spare's
    to give, found by the same search without the newcomer: no re-plan for a swap (churn run A, 12-07,
    where each such swap handed the whole swarm over to a new plan for nothing)."""
    a, b, c, s = ids(4)
    speeds = {a: 0.1 / 3, b: 0.1}
    alone = SwarmState("s", 1.0, {p: peer(p) for p in (a, b, c)})
    placed = evaluate_join(alone, job(max_replicas=2), one_stage([a, b]), 20, speeds, [c], 1.0, plan_cfg=FAST)
    assert placed.offer.placed == (c,) and join_verdict(placed.offer)[0] == "improve"
    # the spare was measured (placed before) at the speed a newcomer is believed to have: the median
    # of the measured ones (newcomer_speeds); the search with both happens to pick the newcomer
    spare = SwarmState("s", 1.0, {p: peer(p) for p in (a, b, c, s)})
    measured = speeds | {s: 0.065}
    ev = evaluate_join(spare, job(max_replicas=2), one_stage([a, b]), 20, measured, [c], 1.0, plan_cfg=FAST)
    decision, why = join_verdict(ev.offer)
    assert decision == "keep" and "a plan without it is as fast" in why and ev.plan is None
