"""The step a new plan epoch starts from: the newest checkpoint every stage completed. Pure.

Two witnesses can name that step. Peers report the checkpoints they wrote in their ``Progress``
(``JobProgress.complete_checkpoint`` keeps the newest step every stage reported). The coordinator may also
see a complete checkpoint itself (a local swarm's shared directory, or a disk it was pointed at); the
service reads it (stage 0's ``StageMeta``) and passes it in here, so this module does no I/O. A checkpoint
of another job or another model is never resumed from, and a start beyond the job's last step is capped.
"""

from __future__ import annotations

from dataclasses import dataclass

from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.jobspec import JobSpec


@dataclass(frozen=True)
class ResumePoint:
    step: int  # the plan's start_step: steps already done (0: from the seeded init)
    reason: str  # which witness decided, for the log
    ignored: str | None = None  # why the coordinator's own checkpoint was not used, when it was not


def resume_point(job: JobSpec, on_disk: StageMeta | None, reported: int) -> ResumePoint:
    """Where the next epoch starts, from the coordinator's own complete checkpoint (``on_disk``: stage 0's
    meta of the newest complete step it can read, None without one) and the newest step every stage has
    reported a checkpoint of (``reported``; 0 when none)."""
    if reported < 0:
        raise ValueError(f"reported checkpoint step must be >= 0, got {reported}")
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
