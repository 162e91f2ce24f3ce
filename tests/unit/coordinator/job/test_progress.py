"""The coordinator's job loop decisions (pure) and its resume point on disk."""

import pytest
import torch

from potluck.coordinator.config import CoordinatorConfig
from potluck.coordinator.job.progress import (
    COMPUTE_EMA,
    COMPUTE_WARMUP,
    JobProgress,
    RetryPolicy,
    next_action,
)
from potluck.coordinator.pipeline import PipelineJob
from potluck.coordinator.service import CoordinatorService
from potluck.coordinator.state import SwarmState
from potluck.model.checkpoint import save_stage
from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.identity import Identity
from potluck.protocol.membership import PeerView
from potluck.protocol.training import Holding, Progress, StageAssignment, StepTiming, TrainPlan
from tests.unit.coordinator.job.test_plan import JOB, ids, peer

P = ids(4)
PLAN = TrainPlan(
    job="t",
    epoch=2,
    start_step=0,
    micro_batches=1,
    issued_at=1.0,
    stages=[
        StageAssignment(first_layer=0, last_layer=2, peers=P[:2]),
        StageAssignment(first_layer=2, last_layer=4, peers=P[2:]),
    ],
)
STATE = SwarmState("s", 1.0, {p: peer(p) for p in P})


def rec(
    pid: str,
    step: int,
    state: str = "training",
    epoch: int = 2,
    ckpt: int | None = None,
    suspects: tuple[str, ...] = (),
    at: float | None = None,
) -> Progress:
    pos = PLAN.position(pid) or (0, 0)
    return Progress(
        peer_id=pid,
        job="t",
        epoch=epoch,
        stage=pos[0],
        replica=pos[1],
        step=step,
        state=state,
        checkpoint_step=ckpt,
        issued_at=float(step) if at is None else at,
        message="boom" if state == "failed" else "",
        suspects=list(suspects),
    )


def beating(pid: str, at: float, ttl: float = 30.0) -> PeerView:
    """``pid`` with its latest heartbeat signed at DHT time ``at`` (so it refreshes every ttl / 3 s)."""
    view = peer(pid)
    return PeerView(view.record.model_copy(update={"issued_at": at}), expiration=at + ttl)


def swarm(at: dict[str, float]) -> SwarmState:
    return SwarmState("s", max(at.values()), {p: beating(p, t) for p, t in at.items()})


def test_plan_wait_done():
    prog = JobProgress()
    assert next_action(STATE, JOB, None, prog, 1.0)[0] == "plan"
    prog.update(PLAN, [rec(p, 3) for p in P])
    action, why = next_action(STATE, JOB, PLAN, prog, 100.0)
    assert action == "wait" and "step 3 of" in why
    prog.update(PLAN, [rec(p, JOB.steps, "done") for p in P])
    assert next_action(STATE, JOB, PLAN, prog, 100.0)[0] == "done"


def test_departure_and_failure_replan_and_old_epochs_do_not_count():
    prog = JobProgress()
    gone = SwarmState("s", 1.0, {p: peer(p) for p in P[:3]})
    assert next_action(gone, JOB, PLAN, prog, 100.0)[0] == "replan"
    prog.update(PLAN, [rec(P[1], 5, "failed", epoch=1)])  # a late report of an aborted epoch
    assert next_action(STATE, JOB, PLAN, prog, 100.0)[0] == "wait"
    prog.update(PLAN, [rec(P[1], 5, "failed")])
    action, why = next_action(STATE, JOB, PLAN, prog, 100.0)
    assert action == "replan" and "boom" in why


def test_a_graceful_leave_is_a_leave_unless_a_step_failed_too():
    prog = JobProgress()
    job = JOB.model_copy(update={"min_peers": 2})
    leaving = SwarmState("s", 1.0, {p: peer(p) for p in P[:3]}, leaving=frozenset({P[3]}))
    action, why = next_action(leaving, job, PLAN, prog, 100.0)
    assert action == "leave" and "leaving" in why
    crashed = SwarmState("s", 1.0, {p: peer(p) for p in P[:3]})  # no "leaving" record: a crash
    assert next_action(crashed, job, PLAN, prog, 100.0)[0] == "replan"
    prog.update(PLAN, [rec(P[1], 5, "failed")])
    assert next_action(leaving, job, PLAN, prog, 100.0)[0] == "replan"


def test_failed_plans_never_end_a_job_while_enough_peers_heartbeat():
    prog = JobProgress()
    for _ in range(10):
        prog.new_epoch(failed=True)
    prog.update(PLAN, [rec(P[1], 0, "failed", at=100.0)])
    live = swarm({p: 99.0 for p in P})
    action, why = next_action(live, JOB, PLAN, prog, 200.0)
    assert action == "replan" and "boom" in why  # 10 failures in a row, all 4 peers live: try again
    prog.update(PLAN, [rec(p, 4) for p in P])
    prog.advanced(PLAN)  # new steps completed: the count starts over
    assert prog.failures == 0


def test_the_job_gives_up_only_when_peers_are_gone_and_says_so():
    prog = JobProgress()
    three = swarm({p: 99.0 for p in P[:3]})  # P[3] left; the job needs 4
    # min_peers is the threshold to start: a re-plan on the three (the planner waits if they cannot
    # hold the model)
    assert next_action(three, JOB, PLAN, prog, 100.0)[0] == "replan"
    live = swarm({p: 99.0 for p in P})
    for _ in range(3):
        prog.new_epoch(failed=True)
    prog.update(PLAN, [rec(P[1], 0, "failed", at=100.0)])
    assert next_action(live, JOB, PLAN, prog, 200.0, usable=P)[0] == "replan"
    action, why = next_action(live, JOB, PLAN, prog, 200.0, usable=P[1:])  # P[0] cannot hold a layer
    assert action == "fail" and "only 3 usable" in why
    prog = JobProgress()
    for _ in range(3):
        prog.new_epoch(failed=True)
    action, why = next_action(three, JOB, PLAN, prog, 100.0)
    assert action == "fail"
    assert "3 plans in a row" in why and "only 3 usable live peer(s) remain of the 4" in why


def test_backoff_doubles_from_the_failure_up_to_a_cap():
    retry = RetryPolicy(first_backoff_s=1.0, max_backoff_s=8.0)
    assert [retry.backoff_s(k) for k in range(7)] == [0.0, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    live = swarm({p: 99.0 for p in P})
    prog = JobProgress()
    prog.update(PLAN, [rec(P[1], 0, "failed", at=100.0)])
    assert next_action(live, JOB, PLAN, prog, 100.0, retry=retry)[0] == "replan"  # the first retry: at once
    for _ in range(3):
        prog.new_epoch(failed=True)
    prog.update(PLAN, [rec(P[1], 0, "failed", at=100.0)])
    action, why = next_action(live, JOB, PLAN, prog, 103.0, retry=retry)
    assert action == "hold" and "retrying in 1.0 s" in why  # 3 failures before: 4 s after the failure
    assert next_action(live, JOB, PLAN, prog, 104.5, retry=retry)[0] == "replan"


def test_a_suspect_that_heartbeats_again_stays_in_the_plan():
    prog = JobProgress()
    prog.update(PLAN, [rec(P[1], 0, "failed", suspects=(P[0],), at=100.0)])
    quiet = swarm({P[0]: 95.0, P[1]: 99.0, P[2]: 99.0, P[3]: 99.0})
    action, why = next_action(quiet, JOB, PLAN, prog, 101.0)
    assert action == "hold" and "confirming suspect" in why  # no re-plan with a peer that just failed
    assert prog.verdicts(quiet, 101.0) == ([P[0]], [])
    again = swarm({P[0]: 102.0, P[1]: 99.0, P[2]: 99.0, P[3]: 99.0})  # its next heartbeat lands
    assert prog.verdicts(again, 103.0) == ([], [])
    assert next_action(again, JOB, PLAN, prog, 103.0)[0] == "replan"


def test_a_suspect_without_a_heartbeat_since_is_left_out_within_seconds():
    prog = JobProgress()
    prog.update(PLAN, [rec(P[1], 0, "failed", suspects=(P[0], P[1]), at=100.0)])  # P[1] cannot accuse itself
    quiet = swarm({P[0]: 95.0, P[1]: 99.0, P[2]: 99.0, P[3]: 99.0})  # heartbeat every 10 s, TTL 30 s
    assert prog.verdicts(quiet, 114.0) == ([P[0]], [])  # interval 10 s + slack 5 s not over yet
    pending, excluded = prog.verdicts(quiet, 116.0)  # well before its heartbeat's TTL runs out (125 s)
    assert pending == [] and excluded == [P[0]]
    # Without it 3 usable peers remain of the 4 the job needs: a re-plan on them; no give-up yet.
    assert next_action(quiet, JOB, PLAN, prog, 116.0)[0] == "replan"
    gone = SwarmState("s", 116.0, {p: beating(p, 99.0) for p in P[1:]})
    assert prog.verdicts(gone, 100.5) == ([], [P[0]])  # no heartbeat at all: out at once


def test_a_failed_direct_probe_confirms_a_suspect_at_once():
    prog = JobProgress()
    prog.update(PLAN, [rec(P[1], 0, "failed", suspects=(P[0],), at=100.0)])
    quiet = swarm({P[0]: 95.0, P[1]: 99.0, P[2]: 99.0, P[3]: 99.0})
    prog.probe_failed(P[0], at=99.0)  # a probe from before the suspicion says nothing about it
    assert prog.verdicts(quiet, 101.0) == ([P[0]], [])
    prog.probe_failed(P[0], at=100.5)  # ours, after the suspicion: two witnesses
    assert prog.verdicts(quiet, 101.0) == ([], [P[0]])
    assert next_action(quiet, JOB, PLAN, prog, 101.0)[0] == "replan"  # no waiting out its heartbeat
    again = swarm({P[0]: 102.0, P[1]: 99.0, P[2]: 99.0, P[3]: 99.0})  # yet a heartbeat since still wins
    assert prog.verdicts(again, 103.0) == ([], [])


def test_healthy_reports_do_not_accuse_and_a_late_failure_of_an_older_plan_still_does():
    """A failure report often lands after the coordinator re-planned on a faster report of the same
    failure; its suspicion still counts (the churn benchmark placed a dead peer in four plans in a row
    when it did not), and a heartbeat after it clears it as always."""
    prog = JobProgress()
    prog.update(PLAN, [rec(P[2], 3, suspects=(P[0],), at=100.0)])  # only failed records accuse
    assert prog.suspects == {}
    prog.update(PLAN, [rec(P[1], 0, "failed", epoch=1, suspects=(P[0],), at=100.0)])
    assert prog.suspects == {P[0]: 100.0}
    assert prog.verdicts(swarm({P[0]: 99.0, P[1]: 99.0, P[2]: 99.0, P[3]: 99.0}), 100.5)[0] == [P[0]]
    assert prog.verdicts(swarm({P[0]: 101.0, P[1]: 99.0, P[2]: 99.0, P[3]: 99.0}), 101.5) == ([], [])


def test_complete_checkpoint_needs_every_stage():
    prog = JobProgress()
    prog.update(PLAN, [rec(P[0], 10, ckpt=10)])
    assert prog.complete_checkpoint() == 0  # stage 1 has not reported one
    prog.update(PLAN, [rec(P[2], 10, ckpt=10), rec(P[0], 20, ckpt=20)])
    assert prog.complete_checkpoint() == 10


def test_resume_step_reads_the_newest_complete_checkpoint_of_the_same_job(tmp_path):
    for step in (10, 20):
        meta = StageMeta(
            job=JOB.name,
            step=step,
            stage=0,
            n_stages=1,
            first_layer=0,
            last_layer=4,
            model=JOB.model,
            seed=JOB.seed,
            tokenizer=None,
            epoch=1,
        )
        save_stage(tmp_path, {"w": torch.zeros(2)}, meta)
    cfg = CoordinatorConfig(swarm_id="s", checkpoint_root=tmp_path)
    svc = CoordinatorService(cfg, JOB, Identity.generate())
    assert isinstance(svc.driver, PipelineJob)
    assert svc.driver.planner.resume_step(set()) == 20
    (tmp_path / "step-00000020" / "stage-000.safetensors").write_bytes(b"damaged")
    assert svc.driver.planner.resume_step(set()) == 10
    other = CoordinatorService(cfg, JOB.model_copy(update={"name": "other"}), Identity.generate())
    assert isinstance(other.driver, PipelineJob)
    assert other.driver.planner.resume_step(set()) == 0  # another job's checkpoints are never resumed from


def test_holdings_are_kept_across_epochs_and_the_newest_wins():
    old = Holding(step=30, first_layer=0, last_layer=2)
    new = Holding(step=31, first_layer=0, last_layer=1)
    prog = JobProgress()
    prog.update(PLAN, [rec(P[0], 30, epoch=1).model_copy(update={"holds": old})])
    assert prog.latest == {} and prog.holdings == {P[0]: old}  # another epoch: held state still counts
    prog.new_epoch(failed=True)
    prog.update(PLAN, [rec(P[0], 31).model_copy(update={"holds": new})])
    prog.update(PLAN, [rec(P[0], 30, epoch=1).model_copy(update={"holds": old})])  # older: ignored
    assert prog.holdings == {P[0]: new}


def test_a_plan_start_nobody_reached_is_not_counted_as_done():
    """A hand-off plan starts at a step the old plan has yet to reach: until its peers report, the swarm
    has done what it was seen to do, not the plan's start (which would clear the failure count too)."""
    prog = JobProgress()
    prog.update(PLAN, [rec(p, 80) for p in P])
    prog.advanced(PLAN)
    assert prog.best_step == 80
    prog.new_epoch(failed=True)
    handoff = PLAN.model_copy(update={"epoch": 3, "start_step": 100})
    assert prog.step(handoff) == 80
    prog.update(handoff, [rec(p, 100, epoch=3) for p in P[:3]])
    prog.advanced(handoff)
    assert prog.step(handoff) == 80 and prog.failures == 1  # one peer has not said it got there
    prog.update(handoff, [rec(P[3], 101, epoch=3)])
    prog.advanced(handoff)
    assert prog.step(handoff) == 100 and prog.best_step == 100 and prog.failures == 0
    # A plan that starts at or before a step the swarm reached counts its start for silent peers.
    again = PLAN.model_copy(update={"epoch": 4, "start_step": 90})
    prog.new_epoch(failed=True)
    assert prog.step(again) == 90


def test_compute_times_are_smoothed_per_step_and_measured_anew_under_a_new_plan():
    """One step's compute on a busy machine varies 2x, and a plan's first steps run slower still; the
    plan prices a peer well below its stage's other replicas as a straggler (job.speeds), so one slow
    step must not make it one. A re-read record of the same step counts once; a new plan's work is
    measured afresh, after its warm-up."""

    def timed(step: int, compute: float, epoch: int = 2) -> Progress:
        return rec(P[0], step, epoch=epoch).model_copy(update={"timing": StepTiming(compute=compute)})

    prog = JobProgress()
    prog.update(PLAN, [timed(s, 9.0) for s in range(COMPUTE_WARMUP)])
    assert prog.compute_s == {}  # the warm-up
    prog.update(PLAN, [timed(10, 1.0)])
    assert prog.compute_s == {P[0]: 1.0}
    prog.update(PLAN, [timed(11, 3.0), timed(11, 3.0)])  # read twice: one step
    assert prog.compute_s[P[0]] == pytest.approx(1.0 + COMPUTE_EMA * 2.0)
    later = PLAN.model_copy(update={"epoch": 3})
    prog.update(later, [timed(12, 5.0)])  # the old epoch's record: not this plan's work
    assert prog.compute_s == {}
    prog.update(later, [timed(s, 0.5, epoch=3) for s in range(13, 14 + COMPUTE_WARMUP)])
    assert prog.compute_s == {P[0]: 0.5}
