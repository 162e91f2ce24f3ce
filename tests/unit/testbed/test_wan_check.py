"""The link check's bookkeeping: flow groups, plans, rates from delivery samples, the verdict."""

import itertools

import pytest

from potluck.testbed.wan.check import CheckReport, LinkResult, flow_plan, link_result, rounds, within
from potluck.testbed.wan.probe import delivery_window
from potluck.testbed.wan.spec import INF, LinkTarget


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7])
def test_rounds_cover_every_direction_once_and_no_peer_twice_in_a_round(n):
    groups = rounds(n)
    flat = [pair for g in groups for pair in g]
    assert sorted(flat) == sorted(itertools.permutations(range(n), 2))
    for g in groups:
        peers = [p for pair in g for p in pair]
        assert len(peers) == len(set(peers))
    assert len(groups) <= n * (n - 1) // (n // 2) + n  # close to the matching bound
    assert all(len(g) == 1 for g in rounds(n, serial=True))


def test_flow_plan_skips_slow_start_then_measures_at_the_target_rate():
    nbytes, skip = flow_plan(LinkTarget(0, 1, rtt_ms=50.0, mbps=8.0), measure_s=1.0)
    assert skip == pytest.approx(0.3 + 6 * 0.05)
    assert nbytes == int(1e6 * (skip + 1.0))
    assert flow_plan(LinkTarget(0, 1, 50.0, INF), 1.0)[0] > 0


def test_delivery_window_runs_from_the_skip_to_the_last_delivery():
    samples = [(0.0, 0), (0.5, 10), (1.0, 100), (2.0, 300), (2.5, 400), (2.6, 400), (3.0, 400)]
    assert delivery_window(samples, t_skip=1.0) == (300, pytest.approx(1.5))
    assert delivery_window(samples, t_skip=2.9) == (0, 0.0)  # nothing delivered after the skip
    assert delivery_window([], 0.0) == (0, 0.0)


def test_link_result_counts_each_delivered_segment_as_one_mtu_on_the_wire():
    target = LinkTarget(0, 1, rtt_ms=40.0, mbps=12.0)
    flow = {"window_segs": 1000, "window_s": 1.0, "mss": 1448, "receiver": {"bytes": 1.0, "seconds": 1.0}}
    r = link_result(target, 41.0, flow, mtu=1500)
    assert r.mbps_measured == pytest.approx(12.0)
    assert r.goodput_mbps == pytest.approx(1000 * 1448 * 8e-6)
    assert r.rtt_ms_measured == 41.0 and r.ok(0.1)


def test_link_result_falls_back_to_the_receivers_whole_flow():
    flow = {"window_segs": 0, "window_s": 0.0, "mss": 1448, "receiver": {"bytes": 1448e3, "seconds": 2.0}}
    r = link_result(LinkTarget(1, 0, 40.0, 6.0), 40.0, flow, mtu=1500)
    assert r.goodput_mbps == pytest.approx(5.792)
    assert r.mbps_measured == pytest.approx(6.0)


def test_report_is_ok_only_when_every_link_is_within_tolerance():
    good = LinkResult(0, 1, 40.0, 42.0, 10.0, 9.5, 9.2)
    slow = LinkResult(1, 0, 40.0, 40.5, 10.0, 8.5, 8.2)
    unlimited = LinkResult(1, 0, 40.0, 40.5, None, 800.0, 780.0)
    assert CheckReport("s", 0.1, [good, unlimited], 1.0, 2.0).ok
    report = CheckReport("s", 0.1, [good, slow], 1.0, 2.0)
    assert not report.ok
    out = report.to_json()
    assert out["ok"] is False and [link["ok"] for link in out["links"]] == [True, False]
    assert set(out["links"][0]) >= {
        "a",
        "b",
        "rtt_ms_target",
        "rtt_ms_measured",
        "mbps_target",
        "mbps_measured",
    }


def test_within_is_relative():
    assert within(109.0, 100.0, 0.1) and not within(111.0, 100.0, 0.1)
    assert within(0.05, 0.0, 0.1)
