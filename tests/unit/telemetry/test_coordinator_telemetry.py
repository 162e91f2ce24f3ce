"""The coordinator's status and events, as pure functions of what the service knows."""

from potluck.coordinator.events import JobLoad, Moment
from potluck.coordinator.job.progress import JobProgress
from potluck.coordinator.state import SwarmState
from potluck.coordinator.telemetry import Watch, swarm_events, swarm_links, swarm_status
from potluck.protocol.records import LinkReport, LinkSample
from potluck.telemetry.summary import JobRate
from tests.unit.coordinator.job.test_plan import JOB, peer
from tests.unit.coordinator.job.test_progress import PLAN, P, rec

ME = "12D3KooW" + "c" * 44


def moment(plan=PLAN, peers=P, progress=None, reason="", finished=False, error=None, rate=None) -> Moment:
    state = SwarmState("s", 1.0, {p: peer(p) for p in peers})
    return Moment(JOB, plan, progress or JobProgress(), state, reason, finished, error, rate=rate)


def test_status_names_the_members_the_plan_and_the_numbers():
    prog = JobProgress()
    prog.update(PLAN, [rec(p, 12).model_copy(update={"loss": 1.25, "bytes_sent_per_step": 100}) for p in P])
    st = swarm_status(moment(progress=prog), ME, 5.0)
    assert st.state == "training" and st.step == 12 and st.loss == 1.25 and st.bytes_per_step == 400
    assert set(st.members) == set(P) and [s.peers for s in st.stages] == [P[:2], P[2:]]
    assert st.tokens_per_s == 0.0  # no rate observed yet
    assert swarm_status(moment(plan=None), ME, 5.0).state == "waiting"
    assert swarm_status(moment(finished=True, error="3 plans failed"), ME, 5.0).state == "failed"


def test_events_say_who_joined_left_what_was_replanned_and_recovered():
    w = Watch()
    assert swarm_events(w, moment(peers=P[:3]), 1.0) == []  # the first look: nobody "just joined"
    out = swarm_events(w, moment(peers=P, reason="a placed peer left -> repair"), 2.0)
    assert ("peer_joined", P[3]) in out
    failed = PLAN.model_copy(update={"epoch": 3, "start_step": 40})
    prog = JobProgress()
    out = swarm_events(w, moment(plan=failed, peers=P[1:], progress=prog, reason="step failed at x"), 3.0)
    assert ("peer_left", P[0]) in out and any(k == "replanned" and "epoch 3" in d for k, d in out)
    prog.update(failed, [rec(p, 41, epoch=3) for p in P])
    out = swarm_events(w, moment(plan=failed, peers=P[1:], progress=prog, reason="step failed at x"), 4.0)
    assert out == [("recovered", "epoch 3 committed step 41")]
    assert swarm_events(w, moment(plan=failed, peers=P[1:], progress=prog), 5.0) == []
    out = swarm_events(w, moment(plan=failed, peers=P[1:], progress=prog, finished=True), 6.0)
    assert out == [("job_done", f"{JOB.name} done")]


def test_links_carry_the_measured_pairs_and_the_planners_estimates():
    report = LinkReport(
        peer_id=P[0], links=[LinkSample(dst=P[1], rtt_ms=2.0, bandwidth_gbps=0.8)], issued_at=1.0
    )
    state = SwarmState("s", 1.0, {p: peer(p) for p in P}, {P[0]: report})
    links = {(x.src, x.dst): x for x in swarm_links(state, ME, 2.0).links}
    assert len(links) == len(P) * (len(P) - 1)  # every ordered pair of members
    got = links[(P[0], P[1])]
    assert (got.mb_s, got.rtt_ms, got.measured) == (100.0, 2.0, True)
    assert sum(x.measured for x in links.values()) == 1


def test_status_lists_every_job_with_its_lease_and_shares_on_a_swarm_of_several_jobs():
    from potluck.protocol.allocation import Allocation, ClassShare, ClassWorkers, Lease, RowShare
    from potluck.telemetry.aggregate import SwarmView

    rows = [
        RowShare(
            jobs=[job], present_s=100.0, shares=[ClassShare(peer_class="cpu", allocation=x, received_s=r)]
        )
        for job, x, r in ((JOB.name, 0.5, 40.0), ("other", 0.5, 60.0))
    ]
    alloc = Allocation(
        round=3,
        policy="max_min",
        lease_start=1.0,
        lease_end=61.0,
        solved_at=1.0,
        classes=[ClassWorkers(peer_class="cpu", workers=4)],
        rows=rows,
        leases=[
            Lease(jobs=[JOB.name], peer_class="cpu", peers=P[:2]),
            Lease(jobs=["other"], peer_class="cpu", peers=P[2:]),
        ],
        issued_at=1.0,
    )
    loads = {JOB.name: JobLoad(1.0, 12, JOB.steps), "other": JobLoad(2.0, 7, 50)}
    m = moment()
    st = swarm_status(Moment(m.job, m.plan, m.progress, m.state, "", False, None, alloc, loads), ME, 5.0)
    shares = {j.job: j for j in st.jobs}
    assert shares[JOB.name].own and shares[JOB.name].peers == P[:2] and shares[JOB.name].received == 0.4
    other = shares["other"]
    assert (other.own, other.weight, other.step, other.steps, other.peers) == (False, 2.0, 7, 50, P[2:])
    assert (other.allocation, other.received, st.lease_round) == (0.5, 0.6, 3)
    assert swarm_status(moment(), ME, 5.0).jobs == []  # a one-job swarm shows no allocation
    view = SwarmView("s", b"k" * 32)
    view.coordinator = st
    snap = view.snapshot(5.0)
    assert [j["job"] for j in snap["jobs"]] == sorted(shares) and snap["lease"] == {"round": 3, "end": 61.0}


def test_the_status_shows_the_services_one_tokens_per_second_figure():
    """The dashboard, /metrics and the launch summary read one formula (``telemetry.summary``): the
    status carries the service's figure, not a peer's own report of its last step."""
    rate = JobRate(JOB.batch.tokens_per_step, JOB.steps)
    rate.observe(2, 10.0)
    rate.observe(12, 15.0)  # 10 steps in 5 s
    prog = JobProgress()
    prog.update(PLAN, [rec(p, 12).model_copy(update={"tokens_per_s": 1e9}) for p in P])
    st = swarm_status(moment(progress=prog, rate=rate.view()), ME, 16.0)
    assert st.tokens_per_s == 2 * JOB.batch.tokens_per_step
