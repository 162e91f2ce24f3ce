"""Measuring links to other peers: round-trip time and goodput over real libp2p streams.

Each peer serves a probe protocol (echo pings, count bulk bytes) and periodically measures a sample of
other peers: a fixed number or O(log N) of them, never all, because the coordinator's network model
estimates the unmeasured pairs. Results become a signed ``LinkReport`` in the DHT.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import statistics
import struct
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from hivemind.p2p import P2P
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo

from potluck.net.config import LinkProbeConfig
from potluck.net.dial import AddressBook, open_stream
from potluck.protocol.errors import WireError
from potluck.protocol.records import LinkSample
from potluck.protocol.wire import MAX_PAYLOAD, Frame, MsgType, read_frame, write_frame

logger = logging.getLogger(__name__)

LAST = 1  # frame flag: the final BULK frame of a probe
CIRCUIT = "/p2p-circuit"  # in a connection's remote address: it runs through a relay
INBOUND_KEPT = 64  # probers whose last probe is remembered (LinkReport.inbound holds at most 64)


def probe_protocol(swarm_id: str) -> str:
    return f"potluck/{swarm_id}/probe/1"


def choose_targets(self_id: str, peer_ids: Sequence[str], round_no: int, minimum: int) -> list[str]:
    """Deterministic sample of peers to measure this round: max(minimum, ceil(log2 N)) of them.

    Each peer walks its own hashed order of the others, k at a time: every round costs it O(log N)
    probes instead of N, different peers probe different targets, and every other peer is measured
    within ceil(N / k) rounds (a random sample per round would leave some pair unmeasured for long).
    """
    others = sorted(set(peer_ids) - {self_id})
    if not others:
        return []
    k = min(len(others), max(minimum, math.ceil(math.log2(len(others) + 1))))

    def rank(peer: str) -> bytes:
        return hashlib.blake2b(f"{self_id}|{peer}".encode(), digest_size=8).digest()

    order = sorted(others, key=rank)
    start = (round_no * k) % len(order)
    return [order[(start + i) % len(order)] for i in range(k)]


async def connections(p2p: P2P) -> dict[str, list[str]]:
    """Per connected peer, the remote addresses of our daemon's open connections to it (one RPC)."""
    return {info.peer_id.to_base58(): [str(a) for a in info.addrs] for info in await p2p.list_peers()}


def uplink_bytes_s(declared_mbps: float | None, samples: Iterable[LinkSample]) -> float | None:
    """A peer's uplink, bytes/s: as its owner declared it (Mbit/s), else the fastest link it measured
    out of itself (a lower bound: each measured link is capped by this uplink and by the far end);
    None before either is known."""
    if declared_mbps is not None:
        return declared_mbps * 1e6 / 8
    best = max((s.bandwidth_gbps for s in samples), default=0.0)
    return best * 1e9 / 8 if best > 0 else None


def relayed_only(addrs: Sequence[str]) -> bool:
    """Whether connections with these remote addresses all run through a relay (none: not relayed)."""
    return bool(addrs) and all(CIRCUIT in a for a in addrs)


class LinkProber:
    def __init__(
        self,
        p2p: P2P,
        swarm_id: str,
        cfg: LinkProbeConfig,
        addresses: AddressBook | None = None,
        allow: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        """``allow(peer)``: whether to serve that peer's probes (None: everyone); a probe costs this
        peer its upload bandwidth, so a swarm serves only its own members."""
        self.p2p, self.cfg = p2p, cfg
        self.addresses = addresses  # peers' announced addresses, for dials the daemon cannot route
        self.allow = allow
        # prober -> the goodput of its last probe as timed here on arrival (LinkReport.inbound)
        self.inbound: dict[str, LinkSample] = {}
        self.protocol = probe_protocol(swarm_id)
        if cfg.frame_bytes > MAX_PAYLOAD[MsgType.BULK]:
            raise ValueError(
                f"frame_bytes {cfg.frame_bytes} exceeds the wire limit {MAX_PAYLOAD[MsgType.BULK]}"
            )

    async def serve(self) -> None:
        await self.p2p.add_binary_stream_handler(self.protocol, self._handle)

    async def _handle(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        received, first_at, first_bytes = 0, 0.0, 0
        try:
            peer = info.peer_id.to_base58()
            if self.allow is not None and not await self.allow(peer):
                logger.info("probe from %s refused: not a member of the swarm", peer)
                return
            while True:
                try:
                    frame = await read_frame(reader, self.cfg.timeout_s, expect={MsgType.PING, MsgType.BULK})
                except WireError as e:
                    if "closed" not in str(e):
                        logger.debug("probe from %s ended: %s", info.peer_id, e)
                    return
                if frame.type == MsgType.PING:
                    await write_frame(writer, Frame(MsgType.PONG, frame.payload), self.cfg.timeout_s)
                    continue
                if received == 0:  # the clock starts when the first frame is in: it is not counted
                    first_at, first_bytes = time.perf_counter(), len(frame.payload)
                received += len(frame.payload)
                if received > self.cfg.max_stream_bytes:
                    logger.warning("probe stream from %s exceeded %d bytes; closing", info.peer_id, received)
                    return
                if frame.flags & LAST:
                    relayed = CIRCUIT in str(info.addr)
                    self._saw(peer, received - first_bytes, time.perf_counter() - first_at, relayed)
                    done = Frame(MsgType.BULK_DONE, struct.pack("<Q", received))
                    await write_frame(writer, done, self.cfg.timeout_s)
                    received = 0
        finally:
            writer.close()

    def _saw(self, peer: str, nbytes: int, seconds: float, relayed: bool = False) -> None:
        if nbytes <= 0 or seconds <= 0:
            return  # a one-frame probe: nothing timed
        self.inbound.pop(peer, None)
        self.inbound[peer] = LinkSample(
            dst=peer, rtt_ms=0.0, bandwidth_gbps=min(nbytes * 8 / seconds / 1e9, 1e5), relayed=relayed
        )
        while len(self.inbound) > INBOUND_KEPT:
            del self.inbound[next(iter(self.inbound))]  # the oldest

    async def measure(self, peer_id: str) -> LinkSample:
        """RTT (median of ``pings``) and goodput to ``peer_id``; raises ``WireError`` on any failure."""
        cfg = self.cfg
        reader, writer = await open_stream(self.p2p, peer_id, self.protocol, cfg.timeout_s, self.addresses)
        try:
            rtts = []
            for i in range(cfg.pings):
                t = time.perf_counter()
                await write_frame(writer, Frame(MsgType.PING, struct.pack("<Q", i)), cfg.timeout_s)
                pong = await read_frame(reader, cfg.timeout_s, expect={MsgType.PONG})
                if pong.payload != struct.pack("<Q", i):
                    raise WireError("probe echo does not match")
                rtts.append(time.perf_counter() - t)
            chunk = bytes(cfg.frame_bytes)
            n_frames = max(1, math.ceil(cfg.bulk_bytes / cfg.frame_bytes))
            t = time.perf_counter()
            for i in range(n_frames):
                flags = LAST if i == n_frames - 1 else 0
                await write_frame(writer, Frame(MsgType.BULK, chunk, flags), cfg.timeout_s)
            done = await read_frame(reader, cfg.timeout_s, expect={MsgType.BULK_DONE})
            elapsed = time.perf_counter() - t
        finally:
            writer.close()
        (received,) = struct.unpack("<Q", done.payload)
        if received != n_frames * len(chunk):
            raise WireError(f"peer counted {received} bytes of {n_frames * len(chunk)}")
        rtt = statistics.median(rtts)
        # The clock ran from the first byte sent to the acknowledgement: subtract one round trip.
        transfer_s = max(elapsed - rtt, 1e-6)
        relayed = relayed_only((await connections(self.p2p)).get(peer_id, []))
        return LinkSample(
            dst=peer_id, rtt_ms=rtt * 1e3, bandwidth_gbps=received * 8 / transfer_s / 1e9, relayed=relayed
        )
