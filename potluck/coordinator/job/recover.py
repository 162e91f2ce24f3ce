"""What a restarted coordinator carries on with. Pure: the records it can read in, a decision out.

A coordinator that crashed leaves its peers training under the plan it last signed. When it comes back
with the same identity and job it must pick that plan up, not publish a new epoch 1: hivemind keeps the
value with the later expiration under a key, so a fresh "epoch 1" would replace the live plan record, and
peers (which act only on a higher epoch than the one they follow) would ignore it, so the swarm would
follow one plan while the coordinator waits on another.

The witnesses, each of which only this coordinator's key could have signed (the DHT validator and the
reader verify every record): the plan record in the DHT, the plan the coordinator saved on its own disk
(``coordinator.memory``; it outlives the plan record's TTL), and the peers' progress records, which name
the epoch each peer follows. The newest plan of this job is the one to carry on with, unless peers report
a newer epoch of it (the plan read was stale): then no plan is known and the next one must be newer than
anything seen. Either way the next epoch published is above every epoch any witness names, so peers never
see two plans with the same epoch, nor an older one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from potluck.coordinator.job.progress import JobProgress
from potluck.protocol.training import Progress, TrainPlan


@dataclass(frozen=True)
class Recovery:
    plan: TrainPlan | None  # the plan the swarm follows now (None: nothing to carry on with)
    progress: JobProgress  # the job's progress under ``plan``, from the peers' records
    next_epoch: int  # the lowest epoch the next plan may carry: above every epoch seen
    reason: str  # what was recovered and from which witness, for the log
    from_saved: bool = False  # ``plan`` came from the coordinator's disk only (not readable in the DHT)


def recover(
    job: str, plans: Iterable[TrainPlan], records: Iterable[Progress], saved: TrainPlan | None = None
) -> Recovery:
    """Decide from the DHT's plan records (``plans``), the peers' progress ``records`` and the plan saved
    on disk (``saved``) which plan of job ``job`` to carry on with and where epochs continue."""
    dht = list(plans)
    records = list(records)
    epochs = [p.epoch for p in dht] + [r.epoch for r in records] + ([saved.epoch] if saved else [])
    highest = max(epochs, default=0)
    ours = [p for p in [*dht, *([saved] if saved else [])] if p.job == job]
    if not ours:
        if highest:
            return Recovery(
                None,
                JobProgress(),
                highest + 1,
                f"no plan of job {job!r} readable; epochs seen up to {highest}",
            )
        return Recovery(None, JobProgress(), 1, "nothing to recover: a new job")
    plan = max(ours, key=lambda p: (p.epoch, p.issued_at))
    from_saved = not any(p.epoch == plan.epoch and p.job == job for p in dht)
    source = "saved on this machine" if from_saved else "read from the DHT"
    if plan.epoch < highest:
        # Peers follow (or the key holds) a newer epoch than the newest plan we can read: that plan is
        # stale, and carrying on with it would leave the coordinator waiting on records it ignores.
        why = f"plan epoch {plan.epoch} ({source}) is older than epoch {highest} that the swarm follows"
        return Recovery(None, JobProgress(), highest + 1, why)
    if plan.status == "done":
        # Nothing runs: a relaunch trains afresh (from the newest checkpoint, e.g. with more steps).
        why = f"the job finished under plan epoch {plan.epoch} ({source}); planning anew"
        return Recovery(None, JobProgress(), plan.epoch + 1, why)
    progress = JobProgress()
    progress.update(plan, records)
    progress.advanced(plan)
    step = progress.step(plan)
    reporting = len(progress.latest)
    why = f"plan epoch {plan.epoch} ({source}) at step {step}; {reporting} peer(s) reported under it"
    return Recovery(plan, progress, plan.epoch + 1, why, from_saved)
