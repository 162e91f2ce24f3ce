"""A replica's trust duties under one plan, built once and hooked into each step (docs/security.md).

Which duties a plan asks for is ``protocol.training``'s to say (``spot_checked``, ``audited``,
``gradients_rechecked``). ``make_ledger`` keeps this peer's sealed messages when any check may ask for
them (the bucketed all-reduce seals into it too, so it exists before the replica sync is built);
``Duties`` holds the checks and gives the step three hooks: ``before_step``; ``seal``, once the step's
messages are all sent and received and before its READY (the step seal, ``peer/seal``); and
``after_commit``, run after the commit and before the optimizer applies the update (checkers recompute
on the weights the step ran on). A plan without checks gets an empty ``Duties`` whose hooks do nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from potluck.compression import Codec
from potluck.model.stage import StageRunner
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Round
from potluck.peer.collectives.buckets import BucketSync
from potluck.peer.collectives.robust import Audit
from potluck.peer.config import AllReduceConfig
from potluck.peer.seal import Ledger, check_seals, deliver_seals
from potluck.peer.train.checks.audit import ShardAudits
from potluck.peer.train.checks.recheck import GradientChecks
from potluck.peer.train.checks.spot import SpotChecks
from potluck.peer.train.commit import Decision
from potluck.peer.train.pipeline import MicroBatch, Timing
from potluck.protocol.collective import AllReduceSchedule
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import TrainPlan, audited, gradients_rechecked, spot_checked


def make_ledger(
    job: JobSpec, plan: TrainPlan, stage: int, identity: Identity | None, peer: str
) -> Ledger | None:
    """The ledger of this peer's sealed messages, when the plan checks its stage's work; else None."""
    if not (spot_checked(job, plan) or audited(job, plan, stage)):
        return None
    if identity is None or identity.peer_id != peer:
        raise ValueError(f"job {job.name} checks its peers' work: the peer's identity must sign")
    return Ledger(identity)


@dataclass(frozen=True)
class Place:
    """Where the checks run: this replica's stage, its peers and its tools."""

    runner: StageRunner
    box: Mailbox
    job: JobSpec
    plan: TrainPlan
    stage: int
    replica: int
    schedule: AllReduceSchedule
    audit: Audit  # contributions this replica refused or found outlying, per peer
    act_codec: Codec
    allreduce: AllReduceConfig  # the stage's all-reduce, summing (not averaging)
    micro_batches: Callable[[int, int], list[MicroBatch]]  # (step, replica): as the trainer builds them
    evidence_timeout_s: float


@dataclass
class Duties:
    ledger: Ledger | None = None
    box: Mailbox | None = None  # what the step seals go over
    audits: ShardAudits | None = None  # of the stage's shard owners under a robust rule
    rechecks: GradientChecks | None = None  # recomputing the step of a peer the rule clipped
    spot: SpotChecks | None = None  # recomputing random micro-batches of the pipeline
    sending: set[asyncio.Task[None]] = field(default_factory=set)  # step seals on their way out

    @classmethod
    def build(cls, at: Place, ledger: Ledger | None, sync: BucketSync | None) -> Duties:
        job, plan, label = at.job, at.plan, f"{at.job.name}/{at.stage}"
        duties = cls(ledger, at.box)
        if ledger is None:
            return duties
        if audited(job, plan, at.stage):
            duties.audits = ShardAudits(
                at.box,
                at.schedule,
                ledger,
                at.allreduce,
                job.trust,
                at.audit,
                at.evidence_timeout_s,
                label=label,
            )
        if sync is not None and gradients_rechecked(job, plan, at.stage):
            duties.rechecks = GradientChecks(
                at.runner,
                at.box,
                list(plan.stages[at.stage].peers),
                at.schedule,
                sync.buckets,
                ledger,
                at.allreduce,
                job.trust,
                at.audit,
                at.micro_batches,
                job.compression.error_feedback,
                label=label,
            )
        if spot_checked(job, plan):
            duties.spot = SpotChecks(
                at.runner,
                at.box,
                plan,
                (at.stage, at.replica),
                ledger,
                at.act_codec,
                job.trust,
                at.audit,
                at.micro_batches,
                at.evidence_timeout_s,
            )
        return duties

    def before_step(self, rnd: Round) -> None:
        if self.ledger is not None:
            self.ledger.forget(rnd.pack())  # an aborted attempt's messages
        if self.rechecks is not None:
            self.rechecks.before_step()

    async def seal(self, rnd: Round, timeout_s: float, timing: Timing, check: bool = True) -> None:
        """Step ``rnd``'s seals. This peer seals what it sent so far and sends the seals in the background
        (a send to a neighbour that died must not hold the step up): the trainer calls it once its
        pipeline sends are done, so the seal travels during the replica sync, and a replica left out of
        the step or whose step failed calls it so its neighbours do not wait out their timeout. With
        ``check`` (before READY) it then waits for the checks of the all-reduce rows it received and
        checks its pipeline neighbours' step seals; ``SealError`` names the sender of a bad or missing one."""
        if self.ledger is None or self.box is None:
            return
        t0 = time.perf_counter()
        seals = self.ledger.close(rnd)
        if seals:
            task = asyncio.create_task(deliver_seals(self.box, rnd, seals), name="step seals")
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)
        if check:
            await self.ledger.settle()  # the seals of the all-reduce's rows, checked on worker threads
            await check_seals(self.box, self.ledger, rnd, timeout_s)
        timing.commit += time.perf_counter() - t0

    async def after_commit(self, rnd: Round, decision: Decision, most_micro_batches: int) -> None:
        """The committed step's checks, before the update: checkers recompute on (and copy) the weights
        the step ran on; then this step's sealed messages, served, are forgotten."""
        if self.audits is not None:
            self.audits.after_commit(rnd, decision)
        if self.rechecks is not None:
            await self.rechecks.after_commit(rnd, decision)
        if self.spot is not None:
            await self.spot.after_commit(rnd, decision, most_micro_batches)
        if self.ledger is not None:
            self.ledger.forget(Round(rnd.epoch, rnd.step + 1).pack())

    def close(self) -> None:
        for duty in (self.spot, self.audits, self.rechecks):
            if duty is not None:
                duty.close()
        for task in self.sending:
            task.cancel()
