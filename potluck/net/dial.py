"""Opening a stream to a peer: retries with backoff over every address the peer announced.

``p2p.call_binary_stream_handler`` asks p2pd to open a stream using whatever its peerstore knows about
the peer. Two peers that only ever met through the coordinator may have no route to each other yet
(p2pd answers at once with ``routing: not found``), and a peer may announce addresses that cannot be
dialed from here (another interface, a closed port, a stale NAT mapping). So a dial first tries the
daemon's own route, then tells the daemon every address the peer announced in its signed heartbeat
(``PeerRecord.maddrs``, relay circuits included where the peer has one) with ``connect``, and retries
with exponential backoff until the caller's timeout. One timeout bounds the whole dial.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

from hivemind.p2p import P2P, PeerID
from hivemind.utils.multiaddr import Multiaddr

from potluck.net.maddrs import WireMaddr
from potluck.net.node import SwarmNode
from potluck.protocol.errors import WireError
from potluck.protocol.keys import PEERS
from potluck.protocol.records import PeerRecord

logger = logging.getLogger(__name__)

# Where to dial a peer: its announced multiaddrs (empty when unknown). May be slow (a DHT read).
AddressBook = Callable[[str], Awaitable[Sequence[str]]]

FIRST_BACKOFF_S = 0.2  # wait after the first failed attempt; doubles after each one
MAX_BACKOFF_S = 2.0  # cap on one wait between attempts
MIN_ATTEMPT_S, MAX_ATTEMPT_S = 2.0, 10.0  # bounds on one attempt, which gets a third of the dial's timeout
ADDRESS_TTL_S = 5.0  # how long a DHT lookup of a peer's addresses is reused


def dial_addresses(maddrs: Sequence[str], peer: str) -> list[Multiaddr]:
    """The announced addresses of ``peer`` as p2pd's ``connect`` takes them: without the trailing
    ``/p2p/<peer>`` (relay circuits keep the relay's id, see ``WireMaddr``), duplicates and unparsable
    ones dropped."""
    out: list[Multiaddr] = []
    seen: set[str] = set()
    suffix = f"/p2p/{peer}"
    for addr in maddrs:
        base = addr[: -len(suffix)] if addr.endswith(suffix) else addr
        if not base or base in seen:
            continue
        try:
            out.append(cast(Multiaddr, WireMaddr(base)) if "/p2p/" in base else Multiaddr(base))
        except Exception:  # a malformed announcement only costs that address
            logger.debug("skipping unparsable address %r of %s", addr, peer)
            continue
        seen.add(base)
    return out


def backoff_s(attempt: int) -> float:
    """Wait after failed attempt ``attempt`` (1-based): 0.2, 0.4, 0.8, ... capped at 2 s, with +-20%
    jitter so two peers dialing each other do not retry in lockstep."""
    base = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (attempt - 1))
    return base * random.uniform(0.8, 1.2)


async def open_stream(
    p2p: P2P,
    peer: str,
    protocol: str,
    timeout_s: float,
    addresses: AddressBook | None = None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream to ``peer``'s ``protocol`` handler, within ``timeout_s`` in total; else ``WireError``
    naming the peer, the attempts and the last error."""
    peer_id = PeerID.from_base58(peer)
    deadline = time.monotonic() + timeout_s
    # A daemon stuck on a stale route must not eat the whole budget: one attempt gets at most a third.
    per_attempt = min(MAX_ATTEMPT_S, max(MIN_ATTEMPT_S, timeout_s / 3))
    attempt, last = 0, "no attempt"
    while True:
        attempt += 1
        attempt_end = min(deadline, time.monotonic() + per_attempt)
        try:
            if attempt > 1 and addresses is not None:
                # The daemon's route failed: hand it every announced address and let it dial them all.
                found = await asyncio.wait_for(addresses(peer), attempt_end - time.monotonic())
                maddrs = dial_addresses(found, peer)
                if maddrs:
                    await asyncio.wait_for(
                        p2p._client.connect(peer_id, maddrs), attempt_end - time.monotonic()
                    )
            _, reader, writer = await asyncio.wait_for(
                p2p.call_binary_stream_handler(peer_id, protocol), attempt_end - time.monotonic()
            )
            if attempt > 1:
                logger.info("stream to %s opened at attempt %d", peer, attempt)
            return reader, writer
        except asyncio.CancelledError:
            raise
        except Exception as e:  # unreachable peers surface as several exception types
            last = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        pause = backoff_s(attempt)
        if time.monotonic() + pause >= deadline:
            raise WireError(
                f"cannot open a stream to {peer} ({attempt} attempts in {timeout_s:.1f} s): {last}"
            )
        logger.debug("dial %s attempt %d failed (%s); retrying in %.2f s", peer, attempt, last, pause)
        await asyncio.sleep(pause)


async def reachable(p2p: P2P, peer: str, maddrs: Sequence[str], timeout_s: float) -> bool:
    """Whether ``peer`` answers a libp2p connection (its key proven by the handshake) at any of
    ``maddrs`` within ``timeout_s``. A crashed peer's port refuses at once; a live one is connected
    already or accepts. Used to confirm a suspicion in seconds instead of waiting for a heartbeat."""
    try:
        await asyncio.wait_for(
            p2p._client.connect(PeerID.from_base58(peer), dial_addresses(maddrs, peer)), timeout_s
        )
    except asyncio.CancelledError:
        raise
    except Exception as e:  # refused, timed out, wrong key: all mean "not reachable from here now"
        logger.info("probe of %s failed: %s", peer, str(e).strip().splitlines()[-1] if str(e).strip() else e)
        return False
    return True


def dht_addresses(node: SwarmNode) -> AddressBook:
    """An ``AddressBook`` reading peers' signed heartbeats from the swarm's DHT (one read serves all
    peers for ``ADDRESS_TTL_S``; concurrent lookups share it)."""
    cache: dict[str, list[str]] = {}
    fetched_at = -float("inf")
    lock = asyncio.Lock()

    async def lookup(peer: str) -> Sequence[str]:
        nonlocal cache, fetched_at
        async with lock:
            if peer not in cache or time.monotonic() - fetched_at > ADDRESS_TTL_S:
                fresh: dict[str, tuple[float, list[str]]] = {}
                for v in await node.fetch(PEERS.name):
                    rec = v.record
                    if isinstance(rec, PeerRecord) and rec.issued_at >= fresh.get(rec.peer_id, (-1.0, []))[0]:
                        fresh[rec.peer_id] = (rec.issued_at, list(rec.maddrs))
                cache = {pid: maddrs for pid, (_, maddrs) in fresh.items()}
                fetched_at = time.monotonic()
            return cache.get(peer, [])

    return lookup
