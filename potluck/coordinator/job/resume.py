"""The step a new plan epoch starts from. Pure.

Live state first: when every stage of the current plan still has a live replica, its weights and
optimizer state are in memory somewhere, so the swarm resumes from the last step it committed and loses
nothing but the step in flight (new holders of those layers pull them over the swarm, peer/state/).
Commits are all-or-nothing across the whole pipeline, so every live peer holds the same committed step;
the newest step any live placed peer reported is that step (a peer whose step failed reports it exactly).

Otherwise checkpoints: two witnesses can name the newest one every stage completed. Peers report the
checkpoints they wrote in their ``Progress`` (``JobProgress.complete_checkpoint`` keeps the newest step
every stage reported). The coordinator also holds complete checkpoints itself: the job owner's copy it
pulls from the peers (``coordinator/copies.py``); the service reads it (stage 0's ``StageMeta``) and
passes it in here, so this module does no I/O. A checkpoint
of another job or another model is never resumed from, and a start beyond the job's last step is capped.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from potluck.coordinator.job.progress import JobProgress
from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import Holding, Progress, StateHolder, TrainPlan


@dataclass(frozen=True)
class ResumePoint:
    step: int  # the plan's start_step: steps already done (0: from the seeded init)
    reason: str  # which witness decided, for the log
    ignored: str | None = None  # why the coordinator's own checkpoint was not used, when it was not
    from_checkpoint: bool = False  # the state is in checkpoints only (TrainPlan.resume_from)


def _covers(ranges: Iterable[tuple[int, int]], n_layers: int) -> bool:
    covered = {x for a, b in ranges for x in range(a, b)}
    return covered >= set(range(n_layers))


def live_step(
    plan: TrainPlan,
    latest: Mapping[str, Progress],
    live: Collection[str],
    known: Mapping[str, Holding] | None = None,
    also: Mapping[str, Sequence[Holding]] | None = None,
) -> int | None:
    """The newest step whose every layer some live peer holds in memory, or None.

    ``latest``: each peer's newest progress record of this plan's epoch; ``live``: peers heartbeating now
    and not excluded; ``known``: the newest ``Progress.holds`` each peer reported under any epoch
    (``JobProgress.holdings``), for live peers with no report of this epoch yet: a plan that failed
    before they reported (a start behind their step, a lost race) must not make the swarm forget the
    state they still serve. ``also``: further states live peers said they serve from memory
    (``Progress.also_holds``, ``JobProgress.also_holdings``), each exactly known.

    A peer running its stage of the plan holds that stage's layers at the step its report says it holds
    (the step the stage's replicas committed, or with DiLoCo local steps their last outer sync, which
    is all a peer can serve between syncs): commits and syncs are all-or-nothing across the pipeline,
    so every such peer holds the newest step any of them reported (a report may lag a step). A peer
    whose run ended holds exactly what it reports (``Progress.holds``: its stage's snapshot, or, when it
    failed before taking the plan's state, the layers it held before, or nothing: churn run C re-planned
    three times from a step nobody held, counting a newcomer that had failed to take it as running it,
    until a later kill); a failed peer of its own stage
    also tells how far the pipeline got, since it can hold only a committed step. A placed peer that
    has not reported under this plan holds its stage at the committed step once the plan committed one,
    else what it reported last (``known``): never the plan's start as such, which it may not have
    reached."""
    running: list[tuple[int, int]] = []  # layer ranges of peers running the plan (at ``committed``)
    exact: list[tuple[int, int, int]] = []  # (step, first, last) of exactly known holdings
    committed: int | None = None
    reported = {p for p, rec in latest.items() if rec.epoch == plan.epoch}
    for p in reported & set(live):
        rec = latest[p]
        pos = plan.position(p)
        mine = (plan.stages[pos[0]].first_layer, plan.stages[pos[0]].last_layer) if pos else None
        held = rec.holds
        if held is None and mine is not None and rec.state != "failed":
            running.append(mine)
            committed = max(committed or 0, rec.step)
        elif held is not None and rec.state in ("training", "done") and held.range == mine:
            running.append(mine)  # at the step it holds: with DiLoCo local steps its last sync
            committed = max(committed or 0, held.step)
        elif held is not None:
            exact.append((held.step, held.first_layer, held.last_layer))
            if held.range == mine:  # it held its stage at a step the pipeline committed
                committed = max(committed or 0, held.step)
    # A placed peer that has not reported under this plan: once the plan committed a step, it took
    # part (a commit needs every placed peer), so it holds its stage at the committed step. Before that
    # it holds what it held last, not the plan's start, which a hand-off plan's start (a step the old
    # plan was still to reach) or a plan that failed at once never gave it.
    trained = committed is not None and committed > plan.start_step
    for stage in plan.stages:
        for p in stage.peers:
            if trained and p in live and p not in reported:
                running.append((stage.first_layer, stage.last_layer))
    for p, held in (known or {}).items():
        if p in live and p not in reported and not (trained and plan.position(p) is not None):
            exact.append((held.step, held.first_layer, held.last_layer))
    for p, more in (also or {}).items():
        if p in live:
            exact += [(h.step, h.first_layer, h.last_layer) for h in more]
    steps = sorted({s for s, _, _ in exact} | ({committed} if committed is not None else set()), reverse=True)
    for step in steps:
        ranges = list(running) if step == committed else []
        ranges += [(a, b) for s, a, b in exact if s == step]
        if _covers(ranges, plan.n_layers):
            return step
    return None


def unheard_survivors(plan: TrainPlan, progress: JobProgress, live: Collection[str]) -> list[str]:
    """The live placed peers of ``plan`` whose run's end (a "failed" or "done" record, each with exactly
    the step it holds) has not been read yet, once the plan committed steps; a repair waits a moment
    for them (``replan.SURVIVORS_S``). Churn runs B and C: 3 of 9 repairs, made 0.03 s after the
    coordinator's probe found the victim gone, started 5-8 steps behind the survivors, who had stopped
    0.05 s after the kill (their last reports lag up to a second of steps); each refused the plan and a
    second followed, 2.4 s later. A plan that never committed a step needs no wait: its peers hold its
    start."""
    if progress.step(plan) <= plan.start_step:
        return []
    ended = {p for p, r in progress.latest.items() if r.epoch == plan.epoch and r.state in ("failed", "done")}
    return sorted(p for p in plan.peers if p in live and p not in ended)


def start_holders(
    step: int,
    live: Collection[str],
    known: Mapping[str, Holding],
    also: Mapping[str, Sequence[Holding]],
) -> list[StateHolder]:
    """The live peers that reported holding layers of ``step`` in memory (``JobProgress.holdings`` and
    ``.also_holdings``), for the plan that starts there (``TrainPlan.holders``), by peer and layers."""
    found = {
        StateHolder(peer_id=p, first_layer=h.first_layer, last_layer=h.last_layer)
        for p, held in [*((p, [h]) for p, h in known.items()), *also.items()]
        if p in live
        for h in held
        if h.step == step
    }
    return sorted(found, key=lambda h: (h.first_layer, h.last_layer, h.peer_id))


def checkpoint_step(stored: Mapping[str, Sequence[Holding]], live: Collection[str], n_layers: int) -> int:
    """The newest step whose every layer a live peer keeps a checkpoint of (0: none), from what peers
    reported (``JobProgress.stored``: each peer's newest own checkpoint and the copies it keeps).

    A peer reports only its newest checkpoint but keeps ``checkpoint.keep`` of them, so a layer counts as
    stored at every step up to the newest a live holder reported; the step is the oldest of those
    newest steps over the layers."""
    newest = [0] * n_layers
    for peer, holdings in stored.items():
        if peer not in live:
            continue
        for h in holdings:
            for layer in range(h.first_layer, min(h.last_layer, n_layers)):
                newest[layer] = max(newest[layer], h.step)
    return min(newest, default=0)


def resume_point(
    job: JobSpec, on_disk: StageMeta | None, reported: int, live: int | None = None
) -> ResumePoint:
    """Where the next epoch starts: the step live replicas hold (``live``, from ``live_step``; None when
    some stage lost every replica or live state was already tried and failed) unless a checkpoint is
    newer (peers that sat out as spares may still serve an old state), else the coordinator's own
    complete checkpoint (``on_disk``: stage 0's meta of the newest complete step it can read, None without
    one) or the newest step every stage has reported a checkpoint of (``reported``; 0 when none)."""
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
    if live is not None and live > 0 and live >= max(disk, reported):  # never an older live state
        step = min(live, job.steps)
        return ResumePoint(step, f"every stage has a live replica holding step {step}", ignored)
    if disk == 0 and reported == 0:
        return ResumePoint(0, "no complete checkpoint: start from the seeded init", ignored)
    if disk >= reported:
        why = f"complete checkpoint at step {disk} on the coordinator's disk"
        return ResumePoint(disk, why, ignored, from_checkpoint=True)
    why = f"every stage reported a checkpoint at step {reported}"
    return ResumePoint(reported, why, ignored, from_checkpoint=True)


# Plans in a row that may start from live state before falling back to checkpoints: a live hand-off
# can fail once for timing (a holder still unwinding its run); twice means the state is not to be had.
LIVE_RESUME_TRIES = 2


def choose_resume(
    job: JobSpec,
    plan: TrainPlan | None,
    progress: JobProgress,
    live_peers: Collection[str],
    disks: Collection[str],
    on_disk: StageMeta | None,
) -> ResumePoint:
    """``resume_point`` from what the job's progress records say: live state (not after a pause, whose
    checkpoint is the point, nor once live state failed ``LIVE_RESUME_TRIES`` times in a row while a
    checkpoint exists), the checkpoints the peers of ``disks`` reported, and the coordinator's own."""
    live = None
    if plan is not None and plan.stop_at is None:
        live = live_step(plan, progress.latest, live_peers, progress.holdings, progress.also_holdings)
    reported = checkpoint_step(progress.stored, disks, job.model.n_layers)
    if progress.failures > LIVE_RESUME_TRIES and on_disk is not None:
        reported = 0
    if progress.failures >= LIVE_RESUME_TRIES and (on_disk is not None or reported > 0):
        live = None  # live state failed twice in a row: a checkpoint, when there is one, instead
    return resume_point(job, on_disk, reported, live)
