"""The class-parallel planner (``classpar/swarm/plan.py``): pure, seeded, speed-aware."""

import numpy as np
import pytest

from potluck.classpar.errors import ClassParallelError
from potluck.classpar.recipe import make_code
from potluck.classpar.swarm.plan import missing_workers, next_plan
from potluck.protocol.classpar import ClassParSubnet, ClassParTeacher, HeldUnit, HeldWorker
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import parse_job
from tests.unit.protocol.conftest import NOW, make_job

SHA = "12" * 32
PEERS = sorted(Identity.generate().peer_id for _ in range(5))


def job(**section):
    cp = {"groups": 2, "parity": 2, **section}
    return parse_job(
        {"name": "bars", "seed": 3, "min_peers": 4, "kind": "class_parallel", "class_parallel": cp}
    )


def features() -> list[list[float]]:
    # classes 0-4 near one point, 5-9 near another: even k-means must split them so
    rng = np.random.default_rng(0)
    pts = np.vstack([rng.normal(0, 0.1, (5, 4)), rng.normal(5, 0.1, (5, 4))])
    return pts.tolist()


def teacher(peer: str) -> ClassParTeacher:
    return ClassParTeacher(
        peer_id=peer,
        job="bars",
        epoch=1,
        sha256=SHA,
        size_bytes=10,
        features=features(),
        val_accuracy=0.9,
        issued_at=NOW,
    )


def held(peer: str, plan, workers: list[int]) -> ClassParSubnet:
    code = make_code(plan.code, len(plan.groups), plan.parity)
    units = [
        HeldWorker(
            worker=w, units=[HeldUnit(unit=u, sha256=SHA, macs=1, val_accuracy=0.5) for u in code.support(w)]
        )
        for w in workers
    ]
    return ClassParSubnet(
        peer_id=peer,
        job="bars",
        teacher_sha256=plan.teacher_sha256,
        groups=plan.groups,
        held=units,
        issued_at=NOW,
    )


def speeds(peers=PEERS[:4], fast=None):
    out = dict.fromkeys(peers, 1.0)
    if fast is not None:
        out[fast] = 5.0
    return out


def test_waits_for_min_peers_then_the_fastest_trains_the_teacher():
    plan, why = next_plan(job(), None, speeds(PEERS[:3]), [], [], NOW)
    assert plan is None and "3 of 4" in why
    plan, _ = next_plan(job(), None, speeds(fast=PEERS[2]), [], [], NOW)
    assert plan is not None and plan.status == "teacher" and plan.teacher == PEERS[2] and plan.epoch == 1
    assert next_plan(job(), plan, speeds(fast=PEERS[2]), [], [], NOW)[0] is None  # still training


def test_the_teachers_features_are_grouped_and_workers_dealt_to_distinct_peers():
    first, _ = next_plan(job(), None, speeds(), [], [], NOW)
    assert first is not None
    other = teacher(PEERS[3])  # not the plan's teacher: ignored
    assert next_plan(job(), first, speeds(), [other], [], NOW)[0] is None
    plan, why = next_plan(job(), first, speeds(), [teacher(first.teacher)], [], NOW + 1)
    assert plan is not None and plan.status == "building" and plan.epoch == 2, why
    assert plan.groups == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]] and plan.teacher_sha256 == SHA
    assert sorted(plan.workers) == PEERS[:4]  # 2 groups + 2 parities on 4 peers: one each
    again, _ = next_plan(job(), first, speeds(), [teacher(first.teacher)], [], NOW + 1)
    assert again == plan  # seeded: a restarted coordinator plans the same


def test_serving_once_every_worker_is_held_with_its_support():
    first, _ = next_plan(job(), None, speeds(), [], [], NOW)
    plan, _ = next_plan(job(), first, speeds(), [teacher(first.teacher)], [], NOW)
    records = [held(p, plan, plan.workers_of(p)) for p in plan.workers[:3]]
    assert missing_workers(plan, records) == [3]
    assert next_plan(job(), plan, speeds(), [], records, NOW)[0] is None
    wrong = held(plan.workers[3], plan, [0])  # a record for a worker the plan gives another peer
    assert missing_workers(plan, [*records, wrong]) == [3]
    stale = held(plan.workers[3], plan, [3]).model_copy(update={"teacher_sha256": "ff" * 32})
    assert missing_workers(plan, [*records, stale]) == [3]
    records.append(held(plan.workers[3], plan, [3]))
    serving, why = next_plan(job(), plan, speeds(), [], records, NOW)
    assert serving is not None and serving.status == "serving" and serving.epoch == plan.epoch, why


def test_a_lost_holder_is_replaced_and_a_lost_teacher_too():
    first, _ = next_plan(job(), None, speeds(), [], [], NOW)
    live = speeds(PEERS)
    del live[first.teacher]
    moved, why = next_plan(job(), first, live, [], [], NOW)
    assert moved is not None and moved.teacher != first.teacher and moved.epoch == 2, why
    plan, _ = next_plan(job(), first, speeds(), [teacher(first.teacher)], [], NOW)
    gone = plan.workers[1]
    live = {p: 1.0 for p in PEERS if p != gone}
    dealt, why = next_plan(job(), plan, live, [], [], NOW)
    assert dealt is not None and dealt.status == "building" and dealt.epoch == plan.epoch + 1
    assert dealt.workers[1] == PEERS[4]  # the live peer holding nothing yet
    assert [w for i, w in enumerate(dealt.workers) if i != 1] == [
        w for i, w in enumerate(plan.workers) if i != 1
    ]


def test_a_pipeline_job_has_no_class_parallel_plan():
    with pytest.raises(ClassParallelError):
        next_plan(make_job(), None, speeds(), [], [], NOW)


def test_a_teacher_lost_before_every_group_is_built_starts_over():
    first, _ = next_plan(job(), None, speeds(), [], [], NOW)
    plan, _ = next_plan(job(), first, speeds(), [teacher(first.teacher)], [], NOW)
    live = {p: 1.0 for p in PEERS if p != plan.teacher}
    again, why = next_plan(job(), plan, live, [], [], NOW)
    assert again is not None and again.status == "teacher" and again.teacher in live, why
    assert again.epoch == plan.epoch + 1 and not again.groups
    # once both groups have a copy on a live peer, the teacher is not needed any more
    copies = [held(plan.workers[2], plan, [2])]  # a parity holder: both units
    if plan.workers[2] == plan.teacher:
        copies = [held(plan.workers[3], plan, [3])]
    kept, _ = next_plan(job(), plan, live, [], copies, NOW)
    assert kept is None or kept.status != "teacher"
