"""The relay's timing arithmetic, without sockets or clocks: when each packet leaves, or that it drops.

Every rate-limited resource (a peer's upload, a directed pair's path, a peer's download) is a FIFO
``Serializer``: a packet of s bytes arriving at time t starts when the resource is free, occupies it
for s / rate seconds and leaves at the end. Its queue is described by time alone: the backlog waiting
when a packet arrives is ``(free_at - t) * rate`` bytes, and a packet that would push the backlog past
the limit is dropped (drop-tail), so no counters need updating when packets leave.

A packet a -> b passes a's upload, then the pair's path, then the one-way delay, then b's download.
Upload and path are computed together when the packet is read (``LinkScheduler.send``): a's packets
reach the path in the order they left the upload, so both stages are exact at admission. Packets of
several senders reach b's download in the order of their arrival times, which only the relay's event
loop knows, so that stage is a second call (``LinkScheduler.receive``) at the arrival time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

INF = math.inf
MIN_QUEUE_PACKETS = 8  # a queue holds at least this many full-size packets, however slow its rate


def queue_limit_bytes(rate_bytes_s: float, queue_s: float, mtu: int) -> float:
    """Drop-tail limit: ``queue_s`` of data at the rate, and at least ``MIN_QUEUE_PACKETS`` packets."""
    return max(rate_bytes_s * queue_s, float(MIN_QUEUE_PACKETS * mtu))


@dataclass
class Serializer:
    """A FIFO link of ``rate`` bytes/s with a drop-tail queue of ``limit`` bytes (``INF``: no limit)."""

    rate: float
    limit: float
    free_at: float = -INF

    def admit(self, t: float, size: int) -> float | None:
        """Departure time of a ``size``-byte packet arriving at ``t``, or ``None`` if the queue drops it."""
        if self.rate == INF:
            return t
        start = self.free_at if self.free_at > t else t
        if (start - t) * self.rate + size > self.limit:
            return None
        self.free_at = start + size / self.rate
        return self.free_at

    def backlog_bytes(self, t: float) -> float:
        return max(0.0, (self.free_at - t) * self.rate) if self.rate != INF else 0.0


class LinkScheduler:
    """Timing of every directed pair of an N-peer WAN. Rates in bytes/s, delays in seconds."""

    def __init__(
        self,
        delay_s: Sequence[Sequence[float]],
        pair_rate: Sequence[Sequence[float]],
        up_rate: Sequence[float],
        down_rate: Sequence[float],
        queue_s: float = 0.1,
        mtu: int = 1500,
    ) -> None:
        n = len(up_rate)
        self.n = n
        self.delay = [list(map(float, row)) for row in delay_s]

        def link(rate: float) -> Serializer:
            return Serializer(rate, queue_limit_bytes(rate, queue_s, mtu))

        self.up = [link(r) for r in up_rate]
        self.down = [link(r) for r in down_rate]
        self.pair = [[link(pair_rate[a][b] if a != b else INF) for b in range(n)] for a in range(n)]
        self.down_limited = [r != INF for r in down_rate]
        self.dropped = 0

    def send(self, t: float, src: int, dst: int, size: int) -> float | None:
        """A packet read at ``t``: when it reaches ``dst``'s download queue, or ``None`` (dropped)."""
        t1 = self.up[src].admit(t, size)
        if t1 is None:
            self.dropped += 1
            return None
        t2 = self.pair[src][dst].admit(t1, size)
        if t2 is None:  # it used a's upload, then found the path's queue full: lost on the way
            self.dropped += 1
            return None
        return t2 + self.delay[src][dst]

    def receive(self, t: float, dst: int, size: int) -> float | None:
        """A packet reaching ``dst``'s download queue at ``t``: when it is delivered, or ``None``."""
        out = self.down[dst].admit(t, size)
        if out is None:
            self.dropped += 1
        return out


def scheduler_for(
    latency_ms: Sequence[Sequence[float]],
    pair_mbps: Sequence[Sequence[float]],
    up_mbps: Sequence[float],
    down_mbps: Sequence[float],
    queue_ms: float = 100.0,
    mtu: int = 1500,
) -> LinkScheduler:
    """A scheduler from the scenario's units (ms, Mbit/s; ``INF`` = unlimited)."""

    def bps(mbps: float) -> float:
        return INF if mbps == INF else mbps * 1e6 / 8

    return LinkScheduler(
        [[ms / 1000.0 for ms in row] for row in latency_ms],
        [[bps(r) for r in row] for row in pair_mbps],
        [bps(r) for r in up_mbps],
        [bps(r) for r in down_mbps],
        queue_s=queue_ms / 1000.0,
        mtu=mtu,
    )
