"""The coordinator's job loop decisions (pure) and its resume point on disk."""

import torch

from potluck.coordinator.config import CoordinatorConfig
from potluck.coordinator.job.progress import JobProgress, next_action
from potluck.coordinator.service import CoordinatorService
from potluck.coordinator.state import SwarmState
from potluck.model.checkpoint import save_stage
from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.identity import Identity
from potluck.protocol.training import Progress, StageAssignment, TrainPlan
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


def rec(pid: str, step: int, state: str = "training", epoch: int = 2, ckpt: int | None = None) -> Progress:
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
        issued_at=float(step),
        message="boom" if state == "failed" else "",
    )


def test_plan_wait_done():
    prog = JobProgress()
    assert next_action(STATE, JOB, None, prog)[0] == "plan"
    prog.update(PLAN, [rec(p, 3) for p in P])
    action, why = next_action(STATE, JOB, PLAN, prog)
    assert action == "wait" and "step 3 of" in why
    prog.update(PLAN, [rec(p, JOB.steps, "done") for p in P])
    assert next_action(STATE, JOB, PLAN, prog)[0] == "done"


def test_departure_and_failure_replan_and_old_epochs_do_not_count():
    prog = JobProgress()
    gone = SwarmState("s", 1.0, {p: peer(p) for p in P[:3]})
    assert next_action(gone, JOB, PLAN, prog)[0] == "replan"
    prog.update(PLAN, [rec(P[1], 5, "failed", epoch=1)])  # a late report of an aborted epoch
    assert next_action(STATE, JOB, PLAN, prog)[0] == "wait"
    prog.update(PLAN, [rec(P[1], 5, "failed")])
    action, why = next_action(STATE, JOB, PLAN, prog)
    assert action == "replan" and "boom" in why


def test_repeated_failures_without_progress_end_the_job():
    prog = JobProgress()
    for _ in range(3):
        prog.new_epoch(failed=True)
    action, why = next_action(STATE, JOB, PLAN, prog)
    assert action == "fail" and "3 plans in a row" in why
    prog.update(PLAN, [rec(p, 4) for p in P])
    prog.advanced(PLAN)  # new steps completed: the count starts over
    assert prog.failures == 0


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
    assert svc._resume_step() == 20
    (tmp_path / "step-00000020" / "stage-000.safetensors").write_bytes(b"damaged")
    assert svc._resume_step() == 10
    other = CoordinatorService(cfg, JOB.model_copy(update={"name": "other"}), Identity.generate())
    assert other._resume_step() == 0  # another job's checkpoints are never resumed from
