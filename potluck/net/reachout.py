"""Connection reversal: a peer behind a NAT dials the public peers itself.

Nobody can dial a NATed peer; a public peer that wants to send to it reaches it through a relay circuit
(the addresses it announces), which costs the relay's bandwidth and libp2p's circuit limits. But the
NATed peer can dial out, and libp2p opens streams in both directions over whatever connection exists.
So a NATed peer keeps a direct connection to every public peer it knows of: then only pairs of NATed
peers need a relay (libp2p's hole punching can still upgrade those where the NATs allow it). It must
dial first: go-libp2p's ``connect`` returns at once when any connection exists, a relayed one too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from hivemind.p2p import P2P

from potluck.net.dial import reachable
from potluck.net.links import CIRCUIT, connections
from potluck.protocol.records import PeerRecord

logger = logging.getLogger(__name__)

MAX_DIALS = 32  # public peers dialled per round at most (a large swarm is covered over rounds)


async def dial_public(p2p: P2P, self_id: str, peers: Sequence[PeerRecord], timeout_s: float) -> list[str]:
    """Dial each public peer in ``peers`` we hold no direct connection to, at its direct (non-circuit)
    addresses, all at once within ``timeout_s``; return the peers now directly connected by this call."""
    todo: list[PeerRecord] = []
    open_now = await connections(p2p)
    for rec in peers:
        if rec.peer_id == self_id or rec.behind_nat:
            continue
        if any(CIRCUIT not in a for a in open_now.get(rec.peer_id, [])):
            continue  # a direct connection already
        if any(CIRCUIT not in m for m in rec.maddrs):
            todo.append(rec)
        if len(todo) >= MAX_DIALS:
            break

    async def one(rec: PeerRecord) -> bool:
        direct = [m for m in rec.maddrs if CIRCUIT not in m]
        return await reachable(p2p, rec.peer_id, direct, timeout_s)

    done = await asyncio.gather(*(one(r) for r in todo))
    dialled = [r.peer_id for r, ok in zip(todo, done, strict=True) if ok]
    if dialled:
        logger.info("behind NAT: dialled %d public peer(s) directly", len(dialled))
    return dialled
