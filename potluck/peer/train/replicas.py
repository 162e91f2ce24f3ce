"""How this replica keeps its stage's replicas in step under one plan: which sync, built once.

One of three, from the job and the plan (docs/collectives.md):
- ``bucket``: the tree all-reduce of the gradients, bucket by bucket, overlapping the backward
  (``collectives/buckets.py``): the default with two replicas or more;
- ``deadline``: one relaxed all-reduce of the whole gradient over the replicas ready by the deadline
  (``straggle.py``): ``sync.policy = "deadline"`` without local steps;
- ``diloco``: local steps and a coded outer sync every H steps (``outer.py``), with partial participation
  (``lateness``) under the deadline policy.
A single replica has none. ``schedule`` is the stage's all-reduce trees (one-hop without any).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from potluck.model.stage import StageRunner
from potluck.net.mailbox import Mailbox
from potluck.peer.collectives.buckets import BucketSync
from potluck.peer.collectives.diloco import DiLoCo
from potluck.peer.collectives.robust import Audit
from potluck.peer.config import AllReduceConfig, TrainerConfig
from potluck.peer.seal import Ledger
from potluck.peer.train.outer import Lateness, make_diloco
from potluck.peer.train.straggle import DeadlineSync
from potluck.protocol.collective import AllReduceSchedule, records_to_schedule
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import TrainPlan, audited


@dataclass
class ReplicaSync:
    schedule: AllReduceSchedule
    bucket: BucketSync | None = None
    deadline: DeadlineSync | None = None
    diloco: DiLoCo | None = None  # replaced when the stage's state is loaded (its snapshot is the weights)
    lateness: Lateness | None = None  # partial participation in the coded outer sync

    @classmethod
    def build(
        cls,
        runner: StageRunner,
        box: Mailbox,
        job: JobSpec,
        plan: TrainPlan,
        stage: int,
        cfg: TrainerConfig,
        allreduce: Callable[[bool], AllReduceConfig],
        audit: Audit,
        ledger: Ledger | None,
    ) -> ReplicaSync:
        """``allreduce(average)``: the stage's all-reduce settings, averaging or summing."""
        assignment, comp, many = plan.stages[stage], job.compression, plan.n_replicas > 1
        out = cls(records_to_schedule(assignment.trees, assignment.peers))
        if comp.sync_every > 1:  # compression.outer: a coded outer sync (outer.py)
            out.diloco = make_diloco(runner.params, comp, job.trust, plan.start_step)
            if job.sync.policy == "deadline" and comp.outer is not None and many:
                out.lateness = Lateness(job.sync.max_misses)
        elif job.sync.policy == "deadline" and many:
            out.deadline = DeadlineSync(
                runner, box, out.schedule, allreduce(True), job.sync, comp.error_feedback, audit
            )
        elif many:
            out.bucket = BucketSync(
                runner,
                box,
                out.schedule,
                allreduce(False),
                cfg.bucket_elements,
                comp.error_feedback,
                cfg.overlap,
                audit,
                ledger if audited(job, plan, stage) else None,  # seals one-hop messages for the audits
            )
        return out
