"""Plans and progress records: consistency rules, who may sign them, and the commit's pure decision."""

import pytest
from pydantic import ValidationError

from potluck.peer.train.commit import Ready, _decide, _parse_ready
from potluck.protocol.envelope import seal
from potluck.protocol.errors import RecordError, WireError
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import CompressionSpec, JobSpec, parse_job
from potluck.protocol.training import Progress, StageAssignment, StateHolder, TrainPlan, TreeRecord
from tests.unit.protocol.conftest import NOW, make_job
from tests.unit.protocol.test_envelope import check

A, B, C, D = (Identity.generate().peer_id for _ in range(4))


def plan(**kw) -> TrainPlan:
    base = dict(
        job="tiny",
        epoch=1,
        start_step=0,
        micro_batches=2,
        issued_at=NOW,
        stages=[
            StageAssignment(first_layer=0, last_layer=1, peers=[A, B]),
            StageAssignment(first_layer=1, last_layer=2, peers=[C, D]),
        ],
    )
    base.update(kw)
    return TrainPlan(**base)


def test_plan_positions_and_leader():
    p = plan()
    assert p.position(D) == (1, 1) and p.position("x" * 20) is None
    assert p.leader == A and p.n_layers == 2 and p.n_replicas == 2


@pytest.mark.parametrize(
    ("stages", "words"),
    [
        (
            [
                StageAssignment(first_layer=0, last_layer=1, peers=[A, B]),
                StageAssignment(first_layer=2, last_layer=3, peers=[C, D]),
            ],
            "do not follow on",
        ),
        (
            [
                StageAssignment(first_layer=0, last_layer=1, peers=[A, B]),
                StageAssignment(first_layer=1, last_layer=2, peers=[C]),
            ],
            "replicas",
        ),
        (
            [
                StageAssignment(first_layer=0, last_layer=1, peers=[A, B]),
                StageAssignment(first_layer=1, last_layer=2, peers=[B, C]),
            ],
            "repeats a peer",
        ),
    ],
)
def test_inconsistent_plans_are_refused(stages, words):
    with pytest.raises(ValidationError, match=words):
        plan(stages=stages)


def test_trees_must_span_the_stage():
    TreeRecord(share=1.0, parents=[-1, 0])
    with pytest.raises(ValidationError, match="exactly one root"):
        StageAssignment(
            first_layer=0, last_layer=1, peers=[A, B], trees=[TreeRecord(share=1.0, parents=[-1, -1])]
        )
    with pytest.raises(ValidationError, match="another replica"):
        StageAssignment(
            first_layer=0, last_layer=1, peers=[A, B], trees=[TreeRecord(share=1.0, parents=[-1, 1])]
        )


def test_plan_signed_by_another_key_is_rejected(policy, coordinator):
    v = check(policy, seal(coordinator, "swarm-a", "plan", plan(), NOW + 30), name="plan")
    assert isinstance(v.record, TrainPlan)
    with pytest.raises(RecordError, match="not signed by the swarm's coordinator"):
        check(policy, seal(Identity.generate(), "swarm-a", "plan", plan(), NOW + 30), name="plan")


def test_progress_only_under_its_own_peer_id(policy):
    me, other = Identity.generate(), Identity.generate()
    rec = Progress(peer_id=me.peer_id, job="tiny", epoch=1, stage=0, replica=0, step=3, issued_at=NOW)
    v = check(
        policy, seal(me, "swarm-a", "progress", rec, NOW + 30, me.peer_id), subkey=me.peer_id, name="progress"
    )
    assert v.record == rec
    with pytest.raises(RecordError):
        check(
            policy,
            seal(other, "swarm-a", "progress", rec, NOW + 30, me.peer_id),
            subkey=me.peer_id,
            name="progress",
        )


def test_commit_decision_sums_norms_per_replica_and_loss_over_the_last_stage():
    p = plan()
    readies = {
        A: Ready(0, 0, 4.0, 0.0),
        B: Ready(0, 1, 4.0, 0.0),
        C: Ready(1, 0, 5.0, 1.25),
        D: Ready(1, 1, 5.0, 1.5),
    }
    d = _decide(p, readies)
    assert d.committed and d.norms == (3.0, 3.0) and d.loss == 2.75
    missing = _decide(p, {k: v for k, v in readies.items() if k != D})
    assert not missing.committed and "missing READY" in missing.reason
    bad = _decide(p, readies | {C: Ready(1, 0, 0.0, 0.0, ok=False, reason="pipeline timeout")})
    assert not bad.committed and "pipeline timeout" in bad.reason


def test_ready_messages_are_checked_before_use():
    ok = b'{"stage":1,"replica":0,"sq_norm":2.0,"loss":0.5,"ok":true}'
    assert _parse_ready(ok, "c", (1, 0)).sq_norm == 2.0
    with pytest.raises(WireError, match="claims stage/replica"):
        _parse_ready(ok, "c", (0, 0))
    with pytest.raises(WireError, match="not JSON"):
        _parse_ready(b"\xff\x00", "c", (1, 0))
    with pytest.raises(WireError, match="lacks fields"):
        _parse_ready(b'{"stage":1}', "c", (1, 0))
    with pytest.raises(WireError, match="bytes"):
        _parse_ready(b" " * 70_000, "c", (1, 0))
    nan = b'{"stage":1,"replica":0,"sq_norm":NaN,"loss":0.5,"ok":true}'
    assert not _parse_ready(nan, "c", (1, 0)).ok


def test_a_plan_that_lost_nobody_signs_without_gone_or_waiting_and_one_that_waits_names_its_own_peers(
    policy, coordinator
):
    """Issue 38: a running epoch re-published with the peers the coordinator declared gone and why it
    waits; at their defaults both keys stay out of the signed bytes (older peers read the plan as ever)."""
    p = plan()
    assert b'"gone"' not in p.canonical_bytes() and b'"waiting"' not in p.canonical_bytes()
    why = "waiting for peers: 3 live, 4 needed to hold the model"
    w = plan(gone=[A], waiting=why)
    v = check(policy, seal(coordinator, "swarm-a", "plan", w, NOW + 30), name="plan")
    assert isinstance(v.record, TrainPlan) and v.record.gone == [A] and v.record.waiting == why
    with pytest.raises(ValidationError, match="declares gone only peers it places"):
        plan(gone=["12D3KooW" + "x" * 44])
    with pytest.raises(ValidationError):
        plan(waiting="x" * 129)  # a short text: the reason, not a log


def test_a_plan_names_the_holders_of_its_start_and_the_newer_step_it_starts_behind(policy, coordinator):
    """Churn run X: the peers of a plan resuming from an older step ask the holders the coordinator names
    (pieces of older layer cuts included), and the holder of the newer, incomplete step is told it is
    known. At their defaults both keys stay out of the signed bytes."""
    p = plan()
    assert b'"holders"' not in p.canonical_bytes() and b'"behind"' not in p.canonical_bytes()
    held = [StateHolder(peer_id=D, first_layer=1, last_layer=2)]
    named = plan(start_step=736, holders=held, behind=816)
    v = check(policy, seal(coordinator, "swarm-a", "plan", named, NOW + 30), name="plan")
    assert isinstance(v.record, TrainPlan) and v.record.holders == held and v.record.behind == 816
    with pytest.raises(ValidationError, match="not past the plan's start"):
        plan(start_step=736, behind=736)
    with pytest.raises(ValidationError, match="outside"):
        plan(holders=[StateHolder(peer_id=D, first_layer=1, last_layer=3)])  # the model has 2 layers


def test_a_job_asking_for_auto_compression_and_a_plan_carrying_the_choice_pass_signed(policy, coordinator):
    """Issue 38, item 2: the signed job carries ``auto`` (every other field at its default), the plan the
    coordinator's choice; both must pass every peer's validator, and ``under`` gives what peers run."""
    job = parse_job(
        {"name": "j", "model": make_job().model.model_dump(), "batch": make_job().batch.model_dump()}
    )
    assert job.compression.auto
    v = check(policy, seal(coordinator, "swarm-a", "job", job, NOW + 30), name="job")
    assert isinstance(v.record, JobSpec) and v.record.compression.auto
    chosen = CompressionSpec(activations_slow="int4:block=64", slow_link_gbps=0.05, sync_every=4)
    p = plan(compression=chosen)
    v = check(policy, seal(coordinator, "swarm-a", "plan", p, NOW + 30), name="plan")
    assert isinstance(v.record, TrainPlan) and v.record.compression == chosen
    assert v.record.under(job).compression == chosen and not v.record.under(job).compression.auto
