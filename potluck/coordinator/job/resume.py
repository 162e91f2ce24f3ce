"""The step a new plan epoch starts from. Pure.

Live state first: when every stage of the current plan still has a live replica, its weights and
optimizer state are in memory somewhere, so the swarm resumes from the last step it committed and loses
nothing but the step in flight (new holders of those layers pull them over the swarm, peer/state/).
Commits are all-or-nothing across the whole pipeline, so every live peer holds the same committed step;
the newest step any live placed peer reported is that step (a peer whose step failed reports it exactly).

Otherwise checkpoints: two witnesses can name the newest one every stage completed. Peers report the
checkpoints they wrote in their ``Progress`` (``JobProgress.complete_checkpoint`` keeps the newest step
every stage reported). The coordinator may also
see a complete checkpoint itself (a local swarm's shared directory, or a disk it was pointed at); the
service reads it (stage 0's ``StageMeta``) and passes it in here, so this module does no I/O. A checkpoint
of another job or another model is never resumed from, and a start beyond the job's last step is capped.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import Progress, TrainPlan


@dataclass(frozen=True)
class ResumePoint:
    step: int  # the plan's start_step: steps already done (0: from the seeded init)
    reason: str  # which witness decided, for the log
    ignored: str | None = None  # why the coordinator's own checkpoint was not used, when it was not


def live_step(plan: TrainPlan, latest: Mapping[str, Progress], live: Collection[str]) -> int | None:
    """The step the swarm of ``plan`` holds in memory, or None when some stage has no live replica.

    ``latest``: each peer's newest progress record of this plan's epoch; ``live``: peers heartbeating now
    and not excluded. A stage whose live replicas never reported counts as held at the plan's start."""
    held = []
    for stage in plan.stages:
        alive = [p for p in stage.peers if p in live]
        if not alive:
            return None
        held += [latest[p].step for p in alive if p in latest and latest[p].epoch == plan.epoch]
    return max(held, default=plan.start_step)


def resume_point(
    job: JobSpec, on_disk: StageMeta | None, reported: int, live: int | None = None
) -> ResumePoint:
    """Where the next epoch starts: the step live replicas hold (``live``, from ``live_step``; None when
    some stage lost every replica or live state was already tried and failed), else the coordinator's own
    complete checkpoint (``on_disk``: stage 0's meta of the newest complete step it can read, None without
    one) or the newest step every stage has reported a checkpoint of (``reported``; 0 when none)."""
    if reported < 0:
        raise ValueError(f"reported checkpoint step must be >= 0, got {reported}")
    if live is not None and live > 0:
        step = min(live, job.steps)
        return ResumePoint(step, f"every stage has a live replica holding step {step}")
    disk, ignored = 0, None
    if on_disk is not None:
        if on_disk.job == job.name and on_disk.model == job.model:
            disk = min(on_disk.step, job.steps)
        else:
            ignored = (
                f"holds a checkpoint of another job ({on_disk.job!r}, not {job.name!r})"
                if on_disk.job != job.name
                else f"holds a checkpoint of job {job.name!r} with another model"
            )
    if disk == 0 and reported == 0:
        return ResumePoint(0, "no complete checkpoint: start from the seeded init", ignored)
    if disk >= reported:
        return ResumePoint(disk, f"complete checkpoint at step {disk} on the coordinator's disk", ignored)
    return ResumePoint(reported, f"every stage reported a checkpoint at step {reported}", ignored)
