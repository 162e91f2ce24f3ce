"""Bytes on the wire of one hivemind baseline peer (``worker.py``), two counters per record:

- ``p2pd_sent`` / ``p2pd_recv``: TCP payload bytes of this peer's p2p daemon, which carries every byte
  hivemind sends (DHT, matchmaking, all-reduce, state): ``bytes_acked`` and ``bytes_received`` of the
  daemon's TCP sockets (``ss -tine``, matched by socket inode to the daemon's fds), polled every
  second; a closed socket keeps its last polled value. Per peer, also on loopback. No headers.
- ``ns_tx`` / ``ns_rx``: the network namespace's interface counters (``/proc/net/dev``, every
  interface except ``lo``): per peer when each peer has its own namespace (the testbed), with link
  headers; on a shared host they count everybody's traffic (``lo`` is left out).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading

logger = logging.getLogger(__name__)

POLL_S = 1.0  # how often the byte counters poll the daemon's sockets


def read_net_dev(path: str = "/proc/net/dev") -> dict[str, tuple[int, int]]:
    """(rx bytes, tx bytes) per interface of this process's network namespace."""
    out: dict[str, tuple[int, int]] = {}
    try:
        with open(path) as f:
            lines = f.readlines()[2:]
    except OSError:
        return out
    for line in lines:
        name, _, rest = line.partition(":")
        fields = rest.split()
        if len(fields) >= 9:
            out[name.strip()] = (int(fields[0]), int(fields[8]))
    return out


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def parse_ss(text: str) -> dict[tuple[int, str, str], tuple[int, int]]:
    """``ss -tinHe`` output -> {(inode, local, peer): (bytes_acked, bytes_received)} (owned sockets)."""
    out: dict[tuple[int, str, str], tuple[int, int]] = {}
    key: tuple[int, str, str] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():  # "STATE recv-q send-q local peer ... ino:N ..."
            parts = line.split()
            ino = next((int(p[4:]) for p in parts if p.startswith("ino:")), 0)
            key = (ino, parts[3], parts[4]) if ino and len(parts) >= 5 else None
            continue
        if key is None:
            continue
        stats = dict(
            p.split(":", 1) for p in line.split() if p.startswith(("bytes_acked:", "bytes_received:"))
        )
        out[key] = (int(stats.get("bytes_acked", 0)), int(stats.get("bytes_received", 0)))
        key = None
    return out


class WireCounter:
    """TCP payload bytes of one process's sockets (the p2p daemon's), and the namespace's interfaces.

    A background thread polls every ``POLL_S``; a socket's last polled counters stay counted after it
    closes, so at most the last second of a short-lived connection goes unseen."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self._seen: dict[tuple[int, str, str], tuple[int, int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ss_ok = pid is not None
        self._dev0 = read_net_dev()
        self._thread = threading.Thread(target=self._run, name="wire-counter", daemon=True)

    def start(self) -> None:
        self.poll()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.poll()

    def poll(self) -> None:
        if not self._ss_ok or self.pid is None:
            return
        inodes = _socket_inodes(self.pid)
        try:
            text = subprocess.run(
                ["ss", "-tinHe"], capture_output=True, text=True, timeout=10, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError) as e:
            logger.warning("ss failed (%s); the daemon's byte counters stop here", e)
            self._ss_ok = False
            return
        sockets = {k: v for k, v in parse_ss(text).items() if k[0] in inodes}
        with self._lock:
            self._seen.update(sockets)

    def totals(self) -> dict[str, int | None]:
        with self._lock:
            sent = sum(v[0] for v in self._seen.values()) if self._ss_ok or self._seen else None
            recv = sum(v[1] for v in self._seen.values()) if self._ss_ok or self._seen else None
        dev = read_net_dev()
        rx = tx = 0
        for name, (r, t) in dev.items():
            if name == "lo":
                continue
            r0, t0 = self._dev0.get(name, (0, 0))
            rx, tx = rx + r - r0, tx + t - t0
        return {"p2pd_sent": sent, "p2pd_recv": recv, "ns_tx": tx, "ns_rx": rx}

    def stop(self) -> None:
        self._stop.set()
        self.poll()
