"""Class-parallel jobs: the job file's section and the signed plan, teacher and sub-network records.

A malformed, oversized, forged or misplaced record is refused by ``envelope.verify`` before any code
reads it; the job file names the field that is wrong."""

import msgpack
import pytest
from pydantic import ValidationError

from potluck.protocol.classpar import ClassParPlan, ClassParSubnet, ClassParTeacher, HeldUnit, HeldWorker
from potluck.protocol.envelope import seal
from potluck.protocol.errors import JobSpecError, RecordError
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import parse_job
from potluck.protocol.keys import JobKeys
from tests.unit.protocol.conftest import NOW, make_job
from tests.unit.protocol.test_envelope import check

SHA = "ab" * 32
GROUPS = [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def plan(peers: list[str], **kw) -> ClassParPlan:
    base = dict(
        job="bars",
        epoch=2,
        status="building",
        teacher=peers[0],
        teacher_sha256=SHA,
        num_classes=10,
        groups=GROUPS,
        parity=1,
        workers=peers[:3],
        issued_at=NOW,
    )
    base.update(kw)
    return ClassParPlan(**base)


def subnet(peer: Identity, **kw) -> ClassParSubnet:
    unit = HeldUnit(unit=0, sha256=SHA, macs=1000, val_accuracy=0.9)
    base = dict(
        peer_id=peer.peer_id,
        job="bars",
        teacher_sha256=SHA,
        groups=GROUPS,
        held=[HeldWorker(worker=0, units=[unit])],
        issued_at=NOW,
    )
    base.update(kw)
    return ClassParSubnet(**base)


def test_the_job_file_section_is_validated_with_the_field_named():
    job = parse_job({"name": "bars", "kind": "class_parallel", "class_parallel": {"groups": 5, "parity": 2}})
    assert job.kind == "class_parallel" and job.class_parallel is not None
    assert job.class_parallel.workers == 7
    with pytest.raises(JobSpecError, match="not divisible by groups"):
        parse_job({"name": "bars", "kind": "class_parallel", "class_parallel": {"groups": 3, "parity": 1}})
    # without parity unequal groups are fine (3, 3, 4 classes)
    parse_job({"name": "bars", "kind": "class_parallel", "class_parallel": {"groups": 3}})
    with pytest.raises(JobSpecError, match="needs kind = 'class_parallel'"):
        parse_job({**make_job().model_dump(), "class_parallel": {"groups": 2}})
    with pytest.raises(JobSpecError, match=r"class_parallel\.groups"):
        parse_job({"name": "bars", "kind": "class_parallel", "class_parallel": {"groups": 0}})
    with pytest.raises(JobSpecError, match="exceeds the 10 classes"):
        parse_job({"name": "bars", "kind": "class_parallel", "class_parallel": {"groups": 12}})
    with pytest.raises(JobSpecError, match="kind"):
        parse_job({"name": "bars", "kind": "other"})


def test_a_pipeline_jobs_signed_bytes_do_not_mention_the_new_fields():
    body = make_job().canonical_bytes()
    assert b"kind" not in body and b"class_parallel" not in body


def test_a_class_parallel_job_round_trips_through_its_signed_record(policy, coordinator):
    job = parse_job({"name": "bars", "kind": "class_parallel", "class_parallel": {"groups": 2, "parity": 1}})
    v = check(policy, seal(coordinator, "swarm-a", "job", job, NOW + 30), name="job")
    assert v.record == job


def test_the_plan_is_accepted_from_the_coordinator_only(policy, coordinator):
    peers = [Identity.generate().peer_id for _ in range(3)]
    rec = plan(peers)
    name = JobKeys("bars").classpar
    assert check(policy, seal(coordinator, "swarm-a", name, rec, NOW + 30), name=name).record == rec
    with pytest.raises(RecordError, match="coordinator"):
        check(policy, seal(Identity.generate(), "swarm-a", name, rec, NOW + 30), name=name)


def test_inconsistent_plans_fail_validation():
    peers = [Identity.generate().peer_id for _ in range(3)]
    with pytest.raises(ValidationError, match="partition"):
        plan(peers, groups=[[0, 1, 2, 3, 4], [5, 6, 7, 8, 8]])
    with pytest.raises(ValidationError, match="same size"):
        plan(peers, groups=[[0, 1, 2, 3], [4, 5, 6, 7, 8, 9]])
    with pytest.raises(ValidationError, match="workers"):
        plan(peers, workers=peers[:2])
    with pytest.raises(ValidationError, match="SHA-256"):
        plan(peers, teacher_sha256=None)
    with pytest.raises(ValidationError, match="teacher plan"):
        plan(peers, status="teacher")
    with pytest.raises(ValidationError):
        plan(peers, teacher_sha256="XY" * 32)


def test_subnet_and_teacher_records_only_from_their_own_peer(policy):
    peer, other = Identity.generate(), Identity.generate()
    name = JobKeys("bars").classpar_subnets
    rec = subnet(peer)
    ok = check(
        policy, seal(peer, "swarm-a", name, rec, NOW + 30, peer.peer_id), name=name, subkey=peer.peer_id
    )
    assert ok.record == rec
    with pytest.raises(RecordError, match="subkey"):
        check(
            policy, seal(other, "swarm-a", name, rec, NOW + 30, peer.peer_id), name=name, subkey=peer.peer_id
        )
    teacher = ClassParTeacher(
        peer_id=peer.peer_id,
        job="bars",
        epoch=1,
        sha256=SHA,
        size_bytes=1000,
        features=[[0.5, 1.0]] * 10,
        val_accuracy=0.8,
        issued_at=NOW,
    )
    tname = JobKeys("bars").classpar_teacher
    value = seal(peer, "swarm-a", tname, teacher, NOW + 30, peer.peer_id)
    assert check(policy, value, name=tname, subkey=peer.peer_id).record == teacher
    with pytest.raises(ValidationError, match="same width"):
        ClassParTeacher.model_validate({**teacher.model_dump(), "features": [[1.0], [1.0, 2.0]]})


def test_a_forged_subnet_record_is_refused(policy):
    peer = Identity.generate()
    name = JobKeys("bars").classpar_subnets
    value = seal(peer, "swarm-a", name, subnet(peer), NOW + 30, peer.peer_id)
    fields = msgpack.unpackb(value)
    fields[4] = fields[4].replace(SHA.encode(), ("cd" * 32).encode())  # another unit hash, same signature
    with pytest.raises(RecordError, match="bad signature"):
        check(policy, msgpack.packb(fields), name=name, subkey=peer.peer_id)


def test_malformed_and_oversized_records_are_refused(policy):
    peer = Identity.generate()
    name = JobKeys("bars").classpar_subnets
    with pytest.raises(ValidationError):  # a unit outside the grouping
        subnet(
            peer, held=[HeldWorker(worker=0, units=[HeldUnit(unit=5, sha256=SHA, macs=1, val_accuracy=0)])]
        )
    with pytest.raises(ValidationError):  # a worker listed twice
        held = HeldWorker(worker=0, units=[HeldUnit(unit=0, sha256=SHA, macs=1, val_accuracy=0)])
        subnet(peer, held=[held, held])
    with pytest.raises(ValidationError):  # more features than a record may carry
        ClassParTeacher(
            peer_id=peer.peer_id,
            job="bars",
            epoch=1,
            sha256=SHA,
            size_bytes=1,
            features=[[0.0] * 2000],
            val_accuracy=0.5,
            issued_at=NOW,
        )
    with pytest.raises(RecordError, match="oversized"):
        check(policy, b"\x00" * (policy.max_value_bytes + 1), name=name, subkey=peer.peer_id)
    # a record of another job under a job-scoped key is refused
    other = JobKeys("other", home=False).classpar_subnets
    with pytest.raises(RecordError, match="another job"):
        check(
            policy,
            seal(peer, "swarm-a", other, subnet(peer), NOW + 30, peer.peer_id),
            name=other,
            subkey=peer.peer_id,
        )
