"""Several jobs on one swarm: job-scoped keys, records signed by a job's owner, offers, the allocation.

A job added to a swarm keeps its spec and plans under ``<job>/job`` and ``<job>/plan``; only the
swarm's coordinator or the key the coordinator admitted as that job's owner may sign them, and a record
of another job is refused under them."""

import pytest

from potluck.coordinator.admission import AdmissionDesk
from potluck.coordinator.config import AdmitConfig
from potluck.protocol.admission import Admission, JoinToken, owner_role
from potluck.protocol.allocation import Allocation, ClassWorkers, JobOffer, Lease, RowShare
from potluck.protocol.envelope import TrustPolicy, seal
from potluck.protocol.errors import AdmissionError, RecordError
from potluck.protocol.identity import Identity
from potluck.protocol.keys import JobKeys, dht_key, scoped, split_name
from potluck.protocol.training import StageAssignment, TrainPlan
from tests.unit.protocol.conftest import NOW, make_job
from tests.unit.protocol.test_envelope import check

COORD = Identity.generate()
POLICY = TrustPolicy("swarm-a", COORD.public_key, require_admission=True)


def plan_of(job: str, peer: str) -> TrainPlan:
    stage = StageAssignment(first_layer=0, last_layer=2, peers=[peer])
    return TrainPlan(job=job, epoch=1, start_step=0, stages=[stage], micro_batches=1, issued_at=NOW)


def owner_admission(owner: Identity, *roles: str) -> bytes:
    return Admission.issue(COORD, "swarm-a", owner.peer_id, NOW + 3600, ("peer", *roles)).encode()


def test_job_keys_name_the_swarm_level_keys_for_the_home_job_and_scoped_ones_otherwise():
    assert (JobKeys("a").job, JobKeys("a").plan, JobKeys("a").progress) == ("job", "plan", "progress")
    other = JobKeys("job-b", home=False)
    assert (other.job, other.plan, other.progress) == ("job-b/job", "job-b/plan", "job-b/progress")
    assert dht_key("swarm-a", other.plan) == "potluck/swarm-a/job-b/plan"
    assert split_name("job-b/plan")[0] == "job-b" and split_name("plan")[0] is None
    for bad in ("job-b/peers", "../plan", "job b/plan", "nothing"):
        with pytest.raises(RecordError):
            split_name(bad)
    with pytest.raises(RecordError):
        scoped("job-b", "bans")


def test_a_jobs_plan_passes_when_signed_by_its_admitted_owner_or_the_coordinator():
    owner, peer = Identity.generate(), Identity.generate()
    plan = plan_of("job-b", peer.peer_id)
    by_owner = seal(
        owner, "swarm-a", "job-b/plan", plan, NOW + 30, None, owner_admission(owner, owner_role("job-b"))
    )
    assert check(POLICY, by_owner, name="job-b/plan").record == plan
    by_coordinator = seal(COORD, "swarm-a", "job-b/plan", plan, NOW + 30)
    assert check(POLICY, by_coordinator, name="job-b/plan").signer == COORD.peer_id
    spec = make_job(name="job-b")
    value = seal(
        owner, "swarm-a", "job-b/job", spec, NOW + 30, None, owner_admission(owner, owner_role("job-b"))
    )
    assert check(POLICY, value, name="job-b/job").record == spec


@pytest.mark.parametrize(
    "roles, why",
    [((), "does not name job"), ((owner_role("job-c"),), "does not name job"), (None, "no admission")],
)
def test_a_jobs_plan_signed_by_anyone_else_is_refused(roles, why):
    """An admitted peer, the owner of another job, or a key without any admission."""
    signer, peer = Identity.generate(), Identity.generate()
    adm = owner_admission(signer, *roles) if roles is not None else None
    value = seal(signer, "swarm-a", "job-b/plan", plan_of("job-b", peer.peer_id), NOW + 30, None, adm)
    with pytest.raises(RecordError, match=why):
        check(POLICY, value, name="job-b/plan")


def test_a_banned_owner_and_a_record_of_another_job_are_refused():
    owner, peer = Identity.generate(), Identity.generate()
    adm = owner_admission(owner, owner_role("job-b"))
    banned = TrustPolicy("swarm-a", COORD.public_key, require_admission=True, banned={owner.peer_id})
    value = seal(owner, "swarm-a", "job-b/plan", plan_of("job-b", peer.peer_id), NOW + 30, None, adm)
    with pytest.raises(RecordError, match="banned"):
        check(banned, value, name="job-b/plan")
    # a plan of job "job-a" (the coordinator's, say) replayed under job-b's key by job-b's owner
    other = seal(owner, "swarm-a", "job-b/plan", plan_of("job-a", peer.peer_id), NOW + 30, None, adm)
    with pytest.raises(RecordError, match="another job"):
        check(POLICY, other, name="job-b/plan")


def test_offers_are_signed_by_their_admitted_owner_and_allocations_by_the_coordinator_only():
    owner = Identity.generate()
    offer = JobOffer(peer_id=owner.peer_id, job="job-b", weight=2.0, submitted_at=NOW, issued_at=NOW)
    value = seal(owner, "swarm-a", "jobs", offer, NOW + 30, owner.peer_id, owner_admission(owner))
    assert check(POLICY, value, name="jobs", subkey=owner.peer_id).record == offer
    with pytest.raises(AdmissionError):  # no admission: a stranger cannot offer jobs
        check(
            POLICY,
            seal(owner, "swarm-a", "jobs", offer, NOW + 30, owner.peer_id),
            name="jobs",
            subkey=owner.peer_id,
        )
    alloc = Allocation(
        round=0,
        policy="max_min",
        lease_start=NOW,
        lease_end=NOW + 60,
        solved_at=NOW,
        classes=[ClassWorkers(peer_class="cpu", workers=1)],
        rows=[RowShare(jobs=["job-b"], present_s=0.0)],
        leases=[Lease(jobs=["job-b"], peer_class="cpu", peers=[owner.peer_id])],
        issued_at=NOW,
    )
    assert (
        check(POLICY, seal(COORD, "swarm-a", "allocation", alloc, NOW + 30), name="allocation").record
        == alloc
    )
    forged = seal(
        owner, "swarm-a", "allocation", alloc, NOW + 30, None, owner_admission(owner, owner_role("job-b"))
    )
    with pytest.raises(RecordError, match="not signed by the swarm's coordinator"):
        check(POLICY, forged, name="allocation")


def test_the_desk_gives_a_job_name_to_its_first_owner_only_and_never_the_swarms_own():
    desk = AdmissionDesk(COORD, "swarm-a", AdmitConfig(), set())
    desk.home_job = "job-a"
    token = JoinToken.mint(COORD, "swarm-a", NOW + 3600)
    first, second = Identity.generate(), Identity.generate()
    adm = desk.decide(first.peer_id, token, NOW, job="job-b")
    assert owner_role("job-b") in adm.roles and "peer" in adm.roles
    assert owner_role("job-b") in desk.decide(first.peer_id, token, NOW, job="job-b").roles  # renewal
    for peer, job in ((second.peer_id, "job-b"), (second.peer_id, "job-a")):
        with pytest.raises(AdmissionError, match="taken"):
            desk.decide(peer, token, NOW, job=job)
    with pytest.raises(AdmissionError, match="invalid job name"):
        desk.decide(second.peer_id, token, NOW, job="../x")
    assert Admission.decode(adm.encode()).roles == adm.roles  # the role survives the wire
