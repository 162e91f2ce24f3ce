"""Link measurement agent: one runs inside each peer namespace (``python -m potluck.testbed.wan.probe``).

It listens on ``PORT`` and serves two kinds of TCP connection, told apart by their first byte:

- ``E`` echo: every ``PING_SIZE``-byte message comes straight back (TCP_NODELAY on both ends), so the
  client times round trips;
- ``S`` sink: the client sends bytes until it closes its side; the agent reads them all and answers
  one JSON line (bytes and seconds from first to last byte), then closes.

A bulk sender samples its socket's ``TCP_INFO`` every few milliseconds: ``tcpi_delivered`` counts the
segments the receiver has acknowledged, SACKed ones included, so the rate over a window does not jump
when a retransmission fills a hole (counting bytes as the receiver reads them does: a loss just before
the window starts lets data held back behind the hole count as arriving inside it, +8% seen here).

On stdin it takes one JSON command a line and answers one JSON line on stdout for each:
``{"op": "ping", "dsts": [...], "count": 20}`` -> ``{"rtt_ms": {dst: [...]}}`` (all destinations at
once, one thread each) and ``{"op": "bulk", "dst": .., "bytes": .., "skip_s": ..}`` -> the sink's
report plus the sender's MSS. It exits when stdin closes. Standard library only, so it starts fast.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from potluck.testbed.wan.relay import raise_priority

logger = logging.getLogger(__name__)

PORT = 7979
PING_SIZE = 32
CHUNK = 256 * 1024
TIMEOUT_S = 60.0
AGENT_NICE = -5
AGENT_RT_PRIORITY = 5  # below the relay's (potluck.testbed.wan.relay.RELAY_RT_PRIORITY)
SAMPLE_S = 0.005  # TCP_INFO sampling period of a bulk sender
TCP_INFO_LEN = 232
_MSS_AT, _DELIVERED_AT = 16, 192  # byte offsets of tcpi_snd_mss and tcpi_delivered in struct tcp_info


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            return b""
        buf += part
    return buf


def _echo(conn: socket.socket) -> None:
    while msg := _recv_exact(conn, PING_SIZE):
        conn.sendall(msg)


def _sink(conn: socket.socket) -> dict[str, float]:
    buf = bytearray(CHUNK)
    total = 0
    t0 = t_end = 0.0
    while got := conn.recv_into(buf):
        t_end = time.monotonic()
        if total == 0:
            t0 = t_end
        total += got
    return {"bytes": float(total), "seconds": t_end - t0}


def _handle(conn: socket.socket) -> None:
    with conn:
        try:
            conn.settimeout(TIMEOUT_S)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            mode = _recv_exact(conn, 1)
            if mode == b"E":
                _echo(conn)
            elif mode == b"S":
                conn.sendall(json.dumps(_sink(conn)).encode() + b"\n")
        except OSError as exc:
            logger.debug("probe connection ended: %s", exc)


def serve(listener: socket.socket) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_handle, args=(conn,), daemon=True).start()


def ping(addr: str, count: int, port: int = PORT, warmup: int = 3) -> list[float]:
    """Round trips of ``count`` small messages over one TCP connection, in milliseconds."""
    with socket.create_connection((addr, port), timeout=TIMEOUT_S) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"E")
        msg = bytes(PING_SIZE)
        out = []
        for k in range(warmup + count):
            start = time.perf_counter()
            s.sendall(msg)
            if not _recv_exact(s, PING_SIZE):
                raise ConnectionError(f"echo from {addr} closed early")
            if k >= warmup:
                out.append((time.perf_counter() - start) * 1000.0)
        return out


def tcp_delivered(sock: socket.socket) -> tuple[int, int]:
    """(segments the peer has acknowledged or SACKed, current MSS) from the socket's ``TCP_INFO``."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
    (mss,) = struct.unpack_from("I", info, _MSS_AT)
    (delivered,) = struct.unpack_from("I", info, _DELIVERED_AT)
    return delivered, mss


def delivery_window(samples: list[tuple[float, int]], t_skip: float) -> tuple[int, float]:
    """Segments delivered and seconds elapsed between the first sample at or after ``t_skip`` and the
    first sample at which delivery reached its final count; (0, 0.0) when there is no such window."""
    if not samples:
        return 0, 0.0
    final = samples[-1][1]
    t_end = next(t for t, d in samples if d == final)
    start = next(((t, d) for t, d in samples if t >= t_skip), None)
    if start is None or t_end <= start[0]:
        return 0, 0.0
    return final - start[1], t_end - start[0]


def bulk(addr: str, nbytes: int, skip_s: float, port: int = PORT) -> dict[str, Any]:
    """Send ``nbytes`` to ``addr``'s sink. Returns the sink's report and, from this side's samples, the
    segments delivered (``window_segs``) over the ``window_s`` seconds that start ``skip_s`` in."""
    with socket.create_connection((addr, port), timeout=TIMEOUT_S) as s:
        s.sendall(b"S")
        samples: list[tuple[float, int]] = []
        done = threading.Event()

        def sample() -> None:
            while True:
                samples.append((time.monotonic(), tcp_delivered(s)[0]))
                if done.wait(SAMPLE_S):
                    return

        start = time.monotonic()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        block = memoryview(bytes(CHUNK))
        left = nbytes
        while left > 0:
            n = min(left, CHUNK)
            s.sendall(block[:n])
            left -= n
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while part := s.recv(4096):
            reply += part
        done.set()
        sampler.join()
        samples.append((time.monotonic(), tcp_delivered(s)[0]))
        segs, window_s = delivery_window(samples, start + skip_s)
        return {
            "receiver": json.loads(reply),
            "mss": tcp_delivered(s)[1],
            "sender_s": time.monotonic() - start,
            "window_segs": segs,
            "window_s": window_s,
        }


def run_command(cmd: dict[str, Any]) -> dict[str, Any]:
    op = cmd.get("op")
    port = int(cmd.get("port", PORT))
    if op == "ping":
        dsts: list[str] = cmd["dsts"]
        count = int(cmd.get("count", 20))
        with ThreadPoolExecutor(max_workers=max(1, len(dsts))) as pool:
            rtts = list(pool.map(lambda d: ping(d, count, port), dsts))
        return {"rtt_ms": dict(zip(dsts, rtts, strict=True))}
    if op == "bulk":
        return bulk(str(cmd["dst"]), int(cmd["bytes"]), float(cmd.get("skip_s", 0.0)), port)
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else PORT
    raise_priority(AGENT_RT_PRIORITY, AGENT_NICE, "probe agent")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen(64)
    threading.Thread(target=serve, args=(listener,), daemon=True).start()
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out = run_command(json.loads(line))
        except (OSError, ValueError, KeyError) as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
