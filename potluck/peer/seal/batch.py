"""Messages made together, sealed together: one signature per batch, the seal riding on each message.

A one-hop all-reduce round cuts a peer's gradient into one slice per shard owner and sends chunk ``c``
of every slice at once (``collectives/tree.py``), plus the owner's own row it keeps for its auditors:
one message per shard owner per chunk. A step seal exchanged afterwards (``exchange.py``) would add a
message per link and a hop to the step for the one signature it saves per message (on the Byzantine
benchmark's 10 replicas, the extra messages cost about what the signatures did). So these messages
are sealed per batch instead: batch ``k`` (chunk ``k`` of every tree) waits until all ``size`` of its
messages are made, one signature covers their Merkle root, and each goes out with its own proof and
the signature attached; the owner checks them on a worker thread before its READY (``Ledger.open_later``).
"""

from __future__ import annotations

import asyncio

from potluck.net.tags import Tag
from potluck.peer.seal.ledger import Ledger

_Entry = tuple[str, Tag, bytes, "asyncio.Future[bytes]"]


class Batches:
    """Batch ``k`` holds ``size`` messages; ``seal`` returns a message's sealed bytes once its batch is
    full (the last message in signs for all)."""

    def __init__(self, ledger: Ledger, size: int) -> None:
        if size < 1:
            raise ValueError(f"a batch holds at least one message, not {size}")
        self.ledger, self.size = ledger, size
        self._open: dict[int, list[_Entry]] = {}

    def add(self, k: int, receiver: str, tag: Tag, payload: bytes) -> asyncio.Future[bytes]:
        """Put a message in batch ``k``; the future holds it sealed once the batch is full."""
        done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        entries = self._open.setdefault(k, [])
        entries.append((receiver, tag, payload, done))
        if len(entries) == self.size:
            del self._open[k]
            sealed = self.ledger.seal_together([(r, t, p) for r, t, p, _ in entries])
            for (_, _, _, future), out in zip(entries, sealed, strict=True):
                future.set_result(out)
        return done

    async def seal(self, k: int, receiver: str, tag: Tag, payload: bytes) -> bytes:
        return await self.add(k, receiver, tag, payload)
