"""The plan of a class-parallel job (docs/class-parallel.md). Pure: records, live peers and the time in,
the next signed plan out (or None: keep the current one), with the reason.

1. ``teacher``: once ``min_peers`` are live, the fastest (claimed TFLOP/s, ties by peer id) trains the
   teacher; if it leaves first, the next fastest does.
2. ``building``: the teacher's record arrived; its mean class features are grouped by even k-means
   seeded from the job's seed (so a restarted coordinator finds the same groups) and the coded workers
   are dealt to the live peers by speed (``classpar.assign``: heaviest workers on the fastest peers).
3. ``serving``: every coded worker's peer published a ``ClassParSubnet`` holding that worker's support,
   built from this plan's teacher and grouping.

A peer holding workers that leaves has its workers dealt to the live peers holding the fewest (fastest
first) in a new epoch, back in ``building``; the others keep what they hold. If the teacher's peer
leaves while some group has no built copy on a live peer, the job starts over from a new teacher.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np

from potluck.classpar import assign, grouping
from potluck.classpar.errors import ClassParallelError
from potluck.classpar.recipe import make_code
from potluck.protocol.classpar import ClassParPlan, ClassParSubnet, ClassParTeacher
from potluck.protocol.jobspec import JobSpec

logger = logging.getLogger(__name__)


def next_plan(
    job: JobSpec,
    plan: ClassParPlan | None,
    speeds: Mapping[str, float],
    teachers: Sequence[ClassParTeacher],
    subnets: Sequence[ClassParSubnet],
    now: float,
    first_epoch: int = 1,
) -> tuple[ClassParPlan | None, str]:
    """The plan to publish next (None: the current one stands) and why. ``speeds``: live peers ->
    claimed or measured TFLOP/s."""
    spec = job.class_parallel
    if spec is None:
        raise ClassParallelError(f"job {job.name} is not a class-parallel job")
    if plan is None:
        if len(speeds) < job.min_peers:
            return None, f"waiting for peers: {len(speeds)} of {job.min_peers} live"
        teacher = assign.by_speed(speeds)[0]
        fresh = ClassParPlan(
            job=job.name,
            epoch=first_epoch,
            status="teacher",
            teacher=teacher,
            num_classes=spec.num_classes,
            parity=spec.parity,
            code=spec.code,
            issued_at=now,
        )
        return fresh, f"{teacher[:12]} trains the teacher"
    if plan.status == "teacher":
        return _after_teacher(job, plan, speeds, teachers, now)
    return _tend_workers(plan, speeds, subnets, now)


def _after_teacher(
    job: JobSpec,
    plan: ClassParPlan,
    speeds: Mapping[str, float],
    teachers: Sequence[ClassParTeacher],
    now: float,
) -> tuple[ClassParPlan | None, str]:
    spec = job.class_parallel
    assert spec is not None
    found = [t for t in teachers if t.peer_id == plan.teacher and t.job == job.name]
    usable = [t for t in found if len(t.features) == plan.num_classes]
    if usable and speeds:
        rec = max(usable, key=lambda t: t.issued_at)
        groups = grouping.even_kmeans(np.asarray(rec.features), spec.groups, seed=job.seed)
        groups = [sorted(int(c) for c in g) for g in groups]
        code = make_code(spec.code, spec.groups, spec.parity)
        workers = assign.assign_workers(code, speeds)
        built = plan.model_copy(
            update={
                "epoch": plan.epoch + 1,
                "status": "building",
                "teacher_sha256": rec.sha256,
                "groups": groups,
                "workers": workers,
                "issued_at": now,
            }
        )
        return ClassParPlan.model_validate(
            built.model_dump()
        ), f"teacher ready ({rec.val_accuracy:.3f}): groups {groups}"
    if plan.teacher not in speeds:
        if not speeds:
            return None, "no live peer to train the teacher"
        teacher = assign.by_speed(speeds)[0]
        moved = plan.model_copy(update={"epoch": plan.epoch + 1, "teacher": teacher, "issued_at": now})
        return moved, f"teacher peer {plan.teacher[:12]} left; {teacher[:12]} trains it"
    return None, f"waiting for {plan.teacher[:12]}'s teacher"


def _tend_workers(
    plan: ClassParPlan, speeds: Mapping[str, float], subnets: Sequence[ClassParSubnet], now: float
) -> tuple[ClassParPlan | None, str]:
    if plan.teacher not in speeds and speeds:
        built = {
            u for rec in subnets if rec.matches(plan) and rec.peer_id in speeds for u in rec.unit_hashes()
        }
        unbuilt = [u for u in range(len(plan.groups)) if u not in built]
        if unbuilt:  # nobody can build them without the teacher (builders fetch it from its peer)
            teacher = assign.by_speed(speeds)[0]
            fresh = ClassParPlan(
                job=plan.job,
                epoch=plan.epoch + 1,
                status="teacher",
                teacher=teacher,
                num_classes=plan.num_classes,
                parity=plan.parity,
                code=plan.code,
                issued_at=now,
            )
            old = plan.teacher[:12]
            return fresh, f"teacher peer {old} left with groups {unbuilt} unbuilt; {teacher[:12]} trains it"
    lost = [w for w, p in enumerate(plan.workers) if p not in speeds]
    if lost:
        if not speeds:
            return None, "no live peer to hold the lost workers"
        workers = list(plan.workers)
        for w in lost:
            load = {p: sum(1 for q in workers if q == p) for p in speeds}
            workers[w] = min(speeds, key=lambda p: (load[p], -speeds[p], p))
        moved = plan.model_copy(
            update={"epoch": plan.epoch + 1, "status": "building", "workers": workers, "issued_at": now}
        )
        gone = sorted({plan.workers[w][:12] for w in lost})
        return moved, f"peer(s) {', '.join(gone)} left: workers {lost} dealt again"
    missing = missing_workers(plan, subnets)
    if plan.status == "building" and not missing:
        return plan.model_copy(
            update={"status": "serving", "issued_at": now}
        ), "every worker is held: serving"
    if missing:
        return None, f"waiting for workers {missing} to be held"
    return None, "serving"


def missing_workers(plan: ClassParPlan, subnets: Sequence[ClassParSubnet]) -> list[int]:
    """The plan's coded workers whose peer has not published that it holds them (with their support),
    built for this plan's teacher and grouping."""
    code = make_code(plan.code, len(plan.groups), plan.parity)
    held: set[int] = set()
    for rec in subnets:
        if not rec.matches(plan):
            continue
        for h in rec.held:
            mine = h.worker < len(plan.workers) and plan.workers[h.worker] == rec.peer_id
            if mine and sorted(u.unit for u in h.units) == code.support(h.worker):
                held.add(h.worker)
    return [w for w in range(len(plan.workers)) if w not in held]


def builder_hashes(plan: ClassParPlan, subnets: Sequence[ClassParSubnet]) -> dict[int, str]:
    """Unit -> the hash its systematic holder's record names (built for this plan's teacher and
    grouping): the copy every parity holder of the unit must hold too."""
    out: dict[int, str] = {}
    for rec in subnets:
        if not rec.matches(plan):
            continue
        for h in rec.held:
            if h.worker < len(plan.groups) and plan.workers[h.worker] == rec.peer_id:
                out.update({u.unit: u.sha256 for u in h.units if u.unit == h.worker})
    return out
