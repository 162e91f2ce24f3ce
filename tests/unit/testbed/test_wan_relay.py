"""The relay's event loop on datagram socket pairs standing in for TUN fds (no root needed)."""

import os
import socket
import threading
import time

import pytest

from potluck.testbed.errors import TestbedError
from potluck.testbed.wan import lab as wanlab
from potluck.testbed.wan.relay import Relay, dest_index
from potluck.testbed.wan.sched import INF, scheduler_for

PREFIX = bytes([10, 79, 0])


def packet(dst: int, size: int = 100) -> bytes:
    head = bytes([0x45]) + bytes(15) + PREFIX + bytes([dst + 1])
    return head + bytes(size - len(head))


def test_dest_index_reads_the_ipv4_destination():
    assert dest_index(packet(2), PREFIX, 3) == 2
    assert dest_index(packet(3), PREFIX, 3) == -1  # outside the peers
    assert dest_index(bytes([0x60]) + packet(1)[1:], PREFIX, 3) == -1  # IPv6
    assert dest_index(packet(1)[:12], PREFIX, 3) == -1  # truncated
    other = packet(1)[:16] + bytes([10, 78, 0, 2]) + bytes(80)
    assert dest_index(other, PREFIX, 3) == -1


@pytest.fixture
def relay_of():
    stops = []

    def start(latency_ms, pair_mbps, up_mbps, down_mbps):
        n = len(up_mbps)
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(n)]
        for inner, _ in pairs:
            inner.setblocking(False)
        relay = Relay(
            [p[0].fileno() for p in pairs], scheduler_for(latency_ms, pair_mbps, up_mbps, down_mbps), PREFIX
        )
        stop_r, stop_w = os.pipe()
        thread = threading.Thread(target=relay.serve, args=(stop_r,), daemon=True)
        thread.start()
        stops.append((stop_w, thread, pairs, stop_r))
        return relay, [p[1] for p in pairs]

    yield start
    for stop_w, thread, pairs, stop_r in stops:
        os.write(stop_w, b"x")
        thread.join(5)
        for a, b in pairs:
            a.close()
            b.close()
        os.close(stop_w)
        os.close(stop_r)


def test_relay_delays_each_direction_by_its_own_latency(relay_of):
    relay, peers = relay_of([[0, 60], [20, 0]], [[INF, INF], [INF, INF]], [INF, INF], [INF, INF])
    for src, dst, want_s in ((0, 1, 0.060), (1, 0, 0.020)):
        peers[dst].settimeout(2)
        start = time.monotonic()
        peers[src].send(packet(dst))
        got = peers[dst].recv(2000)
        took = time.monotonic() - start
        assert got == packet(dst)
        assert want_s <= took < want_s + 0.2  # never early; late only by scheduling (loaded CI)
    deadline = time.monotonic() + 2  # the relay counts just after its write: give it a moment
    while relay.stats.forwarded < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert relay.stats.forwarded == 2


def test_relay_paces_a_burst_at_the_upload_rate_and_drops_strangers(relay_of):
    # 1000-byte packets on a 0.8 Mbit/s upload: one every 10 ms
    relay, peers = relay_of([[0, 0], [0, 0]], [[INF, INF], [INF, INF]], [0.8, INF], [INF, INF])
    peers[0].send(packet(5, 1000))  # nobody there
    peers[0].send(packet(0, 1000))  # to itself
    start = time.monotonic()
    for _ in range(5):
        peers[0].send(packet(1, 1000))
    peers[1].settimeout(2)
    for _ in range(5):
        peers[1].recv(2000)
    took = time.monotonic() - start
    assert 0.045 <= took < 0.5
    assert relay.stats.dropped_unknown == 2


def test_lab_refuses_clearly_without_root(monkeypatch):
    monkeypatch.setattr(wanlab.os, "geteuid", lambda: 1000)
    with pytest.raises(TestbedError, match="needs root"):
        wanlab.require_support()


def test_lab_refuses_clearly_without_tun(monkeypatch):
    monkeypatch.setattr(wanlab.os, "geteuid", lambda: 0)
    real = wanlab.os.path.exists
    monkeypatch.setattr(wanlab.os.path, "exists", lambda p: False if p == "/dev/net/tun" else real(p))
    with pytest.raises(TestbedError, match="/dev/net/tun"):
        wanlab.require_support()
