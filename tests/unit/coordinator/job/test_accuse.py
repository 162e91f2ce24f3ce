"""Replicas' signed testimony convicts a peer only when most of its fellow replicas agree."""

from potluck.coordinator.job.accuse import AccuseConfig, hostile_peers
from potluck.protocol.training import Progress, StageAssignment, TrainPlan, Witness
from tests.unit.coordinator.job.test_plan import ids

CFG = AccuseConfig(min_seen=8, rate=0.5, quorum=0.5)


def plan_of(peers: list[str]) -> TrainPlan:
    st = StageAssignment(first_layer=0, last_layer=2, peers=peers, aggregation="centered_clip")
    return TrainPlan(job="t", epoch=3, start_step=0, stages=[st], micro_batches=1, issued_at=1.0)


def report(peer: str, replica: int, said: dict[str, tuple[int, int]], epoch: int = 3) -> Progress:
    witnessed = [Witness(peer_id=p, seen=s, outlying=o) for p, (s, o) in said.items()]
    return Progress(
        peer_id=peer,
        job="t",
        epoch=epoch,
        stage=0,
        replica=replica,
        step=5,
        witnessed=witnessed,
        issued_at=1.0,
    )


def test_a_peer_most_replicas_clip_is_convicted():
    peers = ids(5)
    bad = peers[4]
    recs = [
        report(p, i, {bad: (20, 18)} | {q: (20, 1) for q in peers[:4] if q != p})
        for i, p in enumerate(peers[:4])
    ]
    assert [p for p, _ in hostile_peers(plan_of(peers), recs, CFG)] == [bad]


def test_a_hostile_minority_cannot_frame_an_honest_peer():
    peers = ids(5)
    liars, victim = peers[3:], peers[0]
    recs = [report(p, 3 + i, {victim: (20, 20)}) for i, p in enumerate(liars)]  # 2 of 4 others: not > half
    recs += [report(p, 1 + i, {victim: (20, 0)}) for i, p in enumerate(peers[1:3])]
    assert hostile_peers(plan_of(peers), recs, CFG) == []


def test_too_little_evidence_old_epochs_and_strangers_do_not_count():
    peers = ids(4)
    bad = peers[3]
    few = [report(p, i, {bad: (3, 3)}) for i, p in enumerate(peers[:3])]  # under min_seen
    old = [report(p, i, {bad: (20, 20)}, epoch=2) for i, p in enumerate(peers[:3])]  # another plan's run
    strangers = [report(p, i, {bad: (20, 20)}) for i, p in enumerate(ids(3))]  # not replicas of its stage
    for recs in (few, old, strangers):
        assert hostile_peers(plan_of(peers), recs, CFG) == []
    # two replicas cannot convict each other: nobody could tell which of them lies
    pair = ids(2)
    assert hostile_peers(plan_of(pair), [report(pair[0], 0, {pair[1]: (20, 20)})], CFG) == []


def spot_report(peer: str, replica: int, caught: dict[str, tuple[int, int]]) -> Progress:
    witnessed = [Witness(peer_id=p, seen=0, outlying=0, checked=c, failed=f) for p, (c, f) in caught.items()]
    return Progress(
        peer_id=peer, job="t", epoch=3, stage=0, replica=replica, step=5, witnessed=witnessed, issued_at=1.0
    )


def test_failed_spot_checks_by_most_fellow_replicas_convict():
    peers = ids(3)
    bad = peers[2]
    recs = [spot_report(p, i, {bad: (3, 1)}) for i, p in enumerate(peers[:2])]  # one failure each suffices
    verdict = hostile_peers(plan_of(peers), recs, CFG)
    assert [p for p, _ in verdict] == [bad] and "recomputed" in verdict[0][1]
    # one checker's word is not enough (it may be the liar), nor are checks that all passed
    assert hostile_peers(plan_of(peers), recs[:1], CFG) == []
    passed = [spot_report(p, i, {bad: (5, 0)}) for i, p in enumerate(peers[:2])]
    assert hostile_peers(plan_of(peers), passed, CFG) == []
    # two colluders of five cannot frame an honest replica
    five = ids(5)
    framed = [spot_report(p, 3 + i, {five[0]: (1, 1)}) for i, p in enumerate(five[3:])]
    assert hostile_peers(plan_of(five), framed, CFG) == []


def test_where_replicas_recompute_clipping_alone_convicts_nobody():
    """Under gradient checks (``rechecked``) outlying testimony is the suspicion, the recomputation the
    verdict: a peer every replica clips but whose step holds up is not convicted; once most of them
    recomputed it otherwise, it is."""
    peers = ids(5)
    odd = peers[4]
    clipped = [
        report(p, i, {odd: (20, 18)} | {q: (20, 1) for q in peers[:4] if q != p})
        for i, p in enumerate(peers[:4])
    ]
    assert [p for p, _ in hostile_peers(plan_of(peers), clipped, CFG)] == [odd]  # without checks
    assert hostile_peers(plan_of(peers), clipped, CFG, rechecked=[0]) == []
    caught = [spot_report(p, i, {odd: (1, 1)}) for i, p in enumerate(peers[:3])]
    verdict = hostile_peers(plan_of(peers), clipped + caught, CFG, rechecked=[0])
    assert [p for p, _ in verdict] == [odd]
    assert "recomputed its work otherwise" in verdict[0][1]
