import math

from potluck.net.links import choose_targets
from potluck.protocol.envelope import Verified
from potluck.protocol.identity import Identity
from potluck.protocol.membership import link_reports
from potluck.protocol.records import LinkReport, LinkSample

IDS = [Identity.generate().peer_id for _ in range(40)]


def test_targets_are_a_deterministic_log_sized_sample_excluding_self():
    me = IDS[0]
    t1 = choose_targets(me, IDS, round_no=0, minimum=4)
    assert t1 == choose_targets(me, list(reversed(IDS)), round_no=0, minimum=4)
    assert me not in t1 and len(set(t1)) == len(t1)
    assert len(t1) == max(4, math.ceil(math.log2(len(IDS))))
    assert choose_targets(me, IDS, round_no=1, minimum=4) != t1  # rounds rotate the sample
    assert choose_targets(me, [me], 0, 4) == []
    assert sorted(choose_targets(me, IDS[:3], 0, 4)) == sorted(IDS[1:3])


def test_rounds_eventually_cover_every_peer():
    me = IDS[0]
    seen: set[str] = set()
    k = len(choose_targets(me, IDS, 0, minimum=4))
    for r in range(math.ceil((len(IDS) - 1) / k)):  # a full walk, whatever the ids hash to
        seen.update(choose_targets(me, IDS, r, minimum=4))
    assert seen == set(IDS[1:])


def test_link_reports_keep_newest_of_live_peers_and_live_destinations():
    a, b, c = IDS[:3]

    def report(src, dsts, exp):
        rec = LinkReport(
            peer_id=src, links=[LinkSample(dst=d, rtt_ms=1, bandwidth_gbps=1) for d in dsts], issued_at=0
        )
        return Verified("links", src, rec, b"", exp)

    records = [report(a, [b, c], 10), report(a, [b], 20), report(b, [a, c, b], 20), report(c, [a], 20)]
    out = link_reports(records, live_ids=[a, b], now=5)
    assert set(out) == {a, b}  # c is not live
    assert [s.dst for s in out[a].links] == [b]  # newest report of a
    assert [s.dst for s in out[b].links] == [a]  # c dead, self-link dropped
    assert link_reports(records, [a, b], now=25) == {}  # all expired


def test_the_uplink_is_the_declared_rate_else_the_fastest_link_measured_out():
    from potluck.net.links import uplink_bytes_s

    samples = [
        LinkSample(dst=IDS[1], rtt_ms=30.0, bandwidth_gbps=0.008),
        LinkSample(dst=IDS[2], rtt_ms=5.0, bandwidth_gbps=0.02),
    ]
    assert uplink_bytes_s(None, []) is None
    assert uplink_bytes_s(None, [LinkSample(dst=IDS[1], rtt_ms=1.0, bandwidth_gbps=0.0)]) is None
    assert uplink_bytes_s(None, samples) == 0.02e9 / 8  # 20 Mbit/s: the faster of the two
    assert uplink_bytes_s(10.0, samples) == 10e6 / 8  # the owner's declaration wins
