"""The userspace router of the emulated WAN: one process holds every peer's TUN device.

The kernel here has no ``netem``, so delay cannot come from a qdisc. Instead each peer namespace has a
TUN device ``tun0`` (address ``<subnet>.<i+1>/24``, the whole subnet routed into it); whatever a peer
sends to another peer's address comes out of its TUN fd in this process as one IPv4 packet. The relay
looks at the destination address, asks the ``LinkScheduler`` when the packet would arrive over the
emulated link (or whether a drop-tail queue drops it), and writes it into the receiver's TUN fd at
that time. Packets to unknown addresses, and anything not IPv4, are dropped.

Run as ``python -m potluck.testbed.wan.relay`` with a JSON config on stdin (``WanLab`` does this):
it creates ``tun0`` inside each named namespace (entering it with setns, so nothing ever appears in
the root namespace), prints ``ready`` and forwards until SIGTERM. The TUN devices are not persistent:
they vanish with the process's fds, however it ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import heapq
import itertools
import json
import logging
import math
import os
import select
import signal
import struct
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from potluck import logs
from potluck.testbed.wan.nat import HomeNat, ip_addr
from potluck.testbed.wan.sched import LinkScheduler, scheduler_for

logger = logging.getLogger(__name__)

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000
PR_SET_TIMERSLACK = 29
NETNS_DIR = "/var/run/netns"
BATCH = 256  # most packets read from one device per wakeup
MAX_PACKET = 65535
RELAY_NICE = -10
RELAY_RT_PRIORITY = 10


def _setns(fd: int) -> None:
    if hasattr(os, "setns"):  # Python 3.12+
        os.setns(fd, CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def open_tun(dev: str) -> int:
    """Create a non-persistent TUN device (no packet-info header) in this thread's namespace."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", dev.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


def open_tun_in(namespace: str, dev: str) -> int:
    """``open_tun`` inside the named network namespace; this thread returns to its own afterwards."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    target = os.open(os.path.join(NETNS_DIR, namespace), os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(target)
        try:
            return open_tun(dev)
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


def dest_index(pkt: bytes, prefix: bytes, n: int) -> int:
    """Peer index of an IPv4 packet's destination ``<prefix>.<i+1>``, or -1 (not IPv4, not a peer)."""
    if len(pkt) < 20 or pkt[0] >> 4 != 4 or not pkt.startswith(prefix, 16):
        return -1
    i = pkt[19] - 1
    return i if 0 <= i < n else -1


@dataclass
class RelayStats:
    forwarded: int = 0
    dropped_queue: int = 0
    dropped_unknown: int = 0
    dropped_nat: int = 0  # refused by a home router (unsolicited inbound, or no mapping possible)
    write_errors: int = 0


class Relay:
    """Forwards packets between ``fds[i]`` (peer i's TUN) through the scheduler's emulated links.

    ``nats[i]``, when set, is peer i's home router: its packets are translated as they enter the relay
    (before its upload link) and packets to it as they leave (after its download link), where a real
    router sits."""

    def __init__(
        self,
        fds: Sequence[int],
        sched: LinkScheduler,
        prefix: bytes,
        nats: Sequence[HomeNat | None] = (),
    ) -> None:
        self.fds = list(fds)
        self.sched = sched
        self.prefix = prefix
        self.nats: list[HomeNat | None] = list(nats) or [None] * len(self.fds)
        if len(self.nats) != len(self.fds):
            raise ValueError("one NAT entry (or None) per device")
        self.stats = RelayStats()

    def serve(self, stop_fd: int = -1) -> None:
        """Forward until ``stop_fd`` (when given) becomes readable, or a signal handler raises."""
        fds, sched, prefix, n = self.fds, self.sched, self.prefix, len(self.fds)
        watched = [*fds, stop_fd] if stop_fd >= 0 else fds
        index = {fd: i for i, fd in enumerate(fds)}
        heap: list[tuple[float, int, int, bytes]] = []  # (arrival at receiver, seq, receiver, packet)
        down: list[deque[tuple[float, bytes]]] = [deque() for _ in fds]  # (delivery time, packet)
        limited = sched.down_limited
        seq = itertools.count()
        read, write, clock, push, pop = os.read, os.write, time.monotonic, heapq.heappush, heapq.heappop
        wait = select.select
        st = self.stats
        nats = self.nats

        def deliver(dst: int, pkt: bytes, now: float) -> None:
            nat = nats[dst]
            if nat is not None:
                translated = nat.inbound(pkt, now)
                if translated is None:
                    st.dropped_nat += 1
                    return
                pkt = translated
            try:
                write(fds[dst], pkt)
                st.forwarded += 1
            except OSError:
                st.write_errors += 1

        while True:
            wake = heap[0][0] if heap else math.inf
            for q in down:
                if q and q[0][0] < wake:
                    wake = q[0][0]
            timeout = None if wake == math.inf else max(0.0, wake - clock())
            ready, _, _ = wait(watched, (), (), timeout)
            now = clock()
            for fd in ready:
                if fd == stop_fd:
                    return
                src = index[fd]
                for _ in range(BATCH):
                    try:
                        pkt = read(fd, MAX_PACKET)
                    except BlockingIOError:
                        break
                    nat = nats[src]
                    if nat is not None:
                        translated = nat.outbound(pkt, now)
                        if translated is None:
                            st.dropped_nat += 1
                            continue
                        pkt = translated
                    dst = dest_index(pkt, prefix, n)
                    if dst < 0 or dst == src:
                        st.dropped_unknown += 1
                        continue
                    t = sched.send(now, src, dst, len(pkt))
                    if t is None:
                        st.dropped_queue += 1
                    else:
                        push(heap, (t, next(seq), dst, pkt))
            now = clock()
            while heap and heap[0][0] <= now:
                t, _, dst, pkt = pop(heap)
                if limited[dst]:
                    out = sched.receive(t, dst, len(pkt))
                    if out is None:
                        st.dropped_queue += 1
                    else:
                        down[dst].append((out, pkt))
                    continue
                deliver(dst, pkt, now)
            for dst, q in enumerate(down):
                while q and q[0][0] <= now:
                    deliver(dst, q.popleft()[1], now)


def raise_priority(rt_priority: int, nice: int, who: str) -> None:
    """Run ahead of ordinary processes (peers, benchmarks): the relay, and the probe agents measuring it,
    are instruments, and each wake-up late by a time slice adds milliseconds to a round trip on a busy
    2-core machine. A real-time class when allowed (both sleep in select or on sockets, and the kernel
    caps real-time tasks at 95% of a CPU anyway), else a high nice."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(rt_priority))
        return
    except (OSError, AttributeError) as exc:
        logger.debug("%s: no real-time scheduling (%s), raising nice instead", who, exc)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError as exc:
        logger.warning("%s: cannot set nice %d (%s); links may be late when the CPU is busy", who, nice, exc)


def _set_timer_slack_ns(ns: int) -> None:
    """Wake from select within ~1 us of the deadline instead of the default 50 us slack."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, ns, 0, 0, 0)


def _floats(rows: Any) -> list[list[float]]:
    return [[math.inf if v is None else float(v) for v in row] for row in rows]


def build(config: dict[str, Any]) -> Relay:
    """Open every namespace's TUN and the scheduler from a config (``WanLab.relay_config``)."""
    namespaces: list[str] = config["namespaces"]
    fds = [open_tun_in(ns, config.get("dev", "tun0")) for ns in namespaces]
    sched = scheduler_for(
        _floats(config["latency_ms"]),
        _floats(config["pair_mbps"]),
        _floats([config["up_mbps"]])[0],
        _floats([config["down_mbps"]])[0],
        queue_ms=float(config.get("queue_ms", 100.0)),
        mtu=int(config.get("mtu", 1500)),
    )
    prefix = ip_addr(str(config["subnet"]) + ".0")[:3]
    nats = [
        HomeNat(kind, prefix + bytes([i + 1])) if kind else None
        for i, kind in enumerate(config.get("nat") or [None] * len(fds))
    ]
    return Relay(fds, sched, prefix, nats)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main() -> None:
    logs.configure(0)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    _set_timer_slack_ns(1000)
    raise_priority(RELAY_RT_PRIORITY, RELAY_NICE, "relay")
    relay = build(json.loads(sys.stdin.read()))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    try:
        relay.serve()
    finally:
        s = relay.stats
        logger.info(
            "relay: %d packets forwarded, %d dropped by queues, %d to unknown addresses, %d by home NATs, "
            "%d write errors",
            s.forwarded,
            s.dropped_queue,
            s.dropped_unknown,
            s.dropped_nat,
            s.write_errors,
        )


if __name__ == "__main__":
    main()
