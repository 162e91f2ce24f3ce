"""The relay's timing arithmetic: serialisation, drop-tail queues, the upload -> path -> delay -> download
order (pure functions, no clock)."""

import pytest

from potluck.testbed.wan.sched import (
    INF,
    MIN_QUEUE_PACKETS,
    LinkScheduler,
    Serializer,
    queue_limit_bytes,
    scheduler_for,
)


def test_serializer_spaces_packets_at_its_rate_and_idles_between_bursts():
    link = Serializer(rate=1000.0, limit=10_000.0)
    assert link.admit(0.0, 1000) == pytest.approx(1.0)
    assert link.admit(0.0, 500) == pytest.approx(1.5)  # queued behind the first
    assert link.admit(5.0, 1000) == pytest.approx(6.0)  # idle link: starts at once


def test_serializer_drops_tail_when_the_backlog_would_pass_the_limit():
    link = Serializer(rate=1000.0, limit=2500.0)
    assert link.admit(0.0, 1000) == pytest.approx(1.0)
    assert link.admit(0.0, 1000) == pytest.approx(2.0)
    assert link.admit(0.0, 1000) is None  # 2000 B waiting + 1000 B > 2500 B
    assert link.backlog_bytes(0.0) == pytest.approx(2000.0)
    assert link.admit(1.0, 1000) == pytest.approx(3.0)  # one left: room again
    assert link.backlog_bytes(3.0) == 0.0


def test_unlimited_serializer_passes_packets_through():
    link = Serializer(rate=INF, limit=INF)
    assert link.admit(2.5, 10**6) == 2.5
    assert link.backlog_bytes(0.0) == 0.0


def test_queue_limit_is_time_at_rate_with_a_floor_of_packets():
    assert queue_limit_bytes(1e6, 0.1, 1500) == pytest.approx(100_000.0)
    assert queue_limit_bytes(1000.0, 0.1, 1500) == MIN_QUEUE_PACKETS * 1500


def two_peers(**kw):
    base = dict(
        delay_s=[[0, 0.05], [0.01, 0]],
        pair_rate=[[INF, 500.0], [INF, INF]],
        up_rate=[1000.0, INF],
        down_rate=[INF, INF],
        queue_s=100.0,
    )
    base.update(kw)
    return LinkScheduler(**base)


def test_send_serialises_on_upload_then_on_the_path_then_adds_the_delay():
    s = two_peers()
    assert s.send(0.0, 0, 1, 100) == pytest.approx(0.1 + 0.2 + 0.05)
    # the second leaves the upload at 0.2 but waits for the path until 0.3
    assert s.send(0.0, 0, 1, 100) == pytest.approx(0.3 + 0.2 + 0.05)
    assert s.send(0.0, 1, 0, 100) == pytest.approx(0.01)  # the other direction: own delay, no rate


def test_upload_is_shared_by_every_destination():
    s = LinkScheduler(
        delay_s=[[0, 0, 0]] * 3, pair_rate=[[INF] * 3] * 3, up_rate=[100.0, INF, INF], down_rate=[INF] * 3
    )
    assert s.send(0.0, 0, 1, 100) == pytest.approx(1.0)
    assert s.send(0.0, 0, 2, 100) == pytest.approx(2.0)


def test_download_is_shared_by_senders_in_arrival_order():
    s = LinkScheduler(
        delay_s=[[0, 0, 0]] * 3, pair_rate=[[INF] * 3] * 3, up_rate=[INF] * 3, down_rate=[INF, INF, 200.0]
    )
    assert s.down_limited == [False, False, True]
    assert s.receive(1.0, 2, 100) == pytest.approx(1.5)
    assert s.receive(1.0, 2, 100) == pytest.approx(2.0)


def test_a_packet_dropped_on_the_path_still_used_the_upload():
    s = two_peers(pair_rate=[[INF, 100.0], [INF, INF]], up_rate=[1000.0, INF], queue_s=0.0, mtu=100)
    # one packet every 0.1 s: the upload (1000 B/s) is idle again for each, the path (100 B/s) is not,
    # so its queue (MIN_QUEUE_PACKETS packets of 100 B) overflows
    got = [s.send(0.1 * k, 0, 1, 100) for k in range(2 * MIN_QUEUE_PACKETS)]
    assert None in got
    assert s.dropped == got.count(None)
    assert s.up[0].free_at == pytest.approx(0.1 * len(got))  # dropped ones were serialised on it too


def test_scheduler_for_converts_milliseconds_and_megabits():
    s = scheduler_for([[0, 20], [30, 0]], [[0, 8], [INF, 0]], [INF, 4], [2, INF], queue_ms=50)
    assert s.delay == [[0.0, 0.02], [0.03, 0.0]]
    assert s.pair[0][1].rate == pytest.approx(1e6)
    assert s.pair[0][0].rate == INF  # the diagonal never limits anything
    assert s.up[1].rate == pytest.approx(0.5e6)
    assert s.down[0].rate == pytest.approx(0.25e6)
    assert s.up[1].limit == pytest.approx(0.5e6 * 0.05)
