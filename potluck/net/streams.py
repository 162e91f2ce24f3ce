"""Plain request/response streams on the peer's libp2p daemon, for protocols outside the mailbox.

The mailbox (``mailbox/box.py``) multiplexes tagged messages of the training step; some protocols instead
want one stream per conversation (a state transfer: request, manifest, chunks). ``Streams`` is the thin,
typed door to hivemind's binary stream handlers for them, so code above ``net`` never touches hivemind:
handlers get the remote peer id as a base58 string (authenticated by libp2p: it is the remote key's id),
and opening a stream is bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo

from potluck.protocol.errors import DialError

logger = logging.getLogger(__name__)

Handler = Callable[[str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
UNSERVE_TIMEOUT_S = 2.0  # longest a shutdown waits for the daemon to drop a handler


class Streams:
    """Serve and open binary streams of named protocols on one P2P daemon."""

    def __init__(self, p2p: P2P) -> None:
        self.p2p = p2p
        self.peer_id = p2p.peer_id.to_base58()
        self._served: set[str] = set()
        # What this node shows a server that asks who it is (its encoded Admission), read at each ask:
        # the daemon renews it. None: nothing to show (the coordinator, tools).
        self.credentials: Callable[[], bytes | None] = lambda: None

    async def serve(self, protocol: str, handler: Handler) -> None:
        """Call ``handler(peer_id, reader, writer)`` for every incoming stream of ``protocol``; the
        writer is closed after the handler returns or raises (a raising handler is logged)."""

        async def on_stream(
            info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            peer = info.peer_id.to_base58()
            try:
                await handler(peer, reader, writer)
            except Exception:  # one bad conversation must not take the daemon's handler down
                logger.exception("%s stream from %s failed", protocol, peer)
            finally:
                writer.close()

        await self.p2p.add_binary_stream_handler(protocol, on_stream)
        self._served.add(protocol)

    async def unserve(self, protocol: str) -> None:
        if protocol in self._served:
            self._served.discard(protocol)
            with contextlib.suppress(Exception):  # the daemon may already be gone, or stuck: bounded
                await asyncio.wait_for(self.p2p.remove_binary_stream_handler(protocol), UNSERVE_TIMEOUT_S)

    async def open(
        self, peer_id: str, protocol: str, timeout_s: float
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new stream to ``peer_id``; ``DialError`` if it cannot be opened within ``timeout_s``.

        One attempt, no retries over announced addresses (``dial.open_stream``): callers ask several
        peers at once (state holders), and a dead one must fail at once rather than hold up the others
        for the whole timeout."""
        try:
            _, reader, writer = await asyncio.wait_for(
                self.p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), protocol), timeout_s
            )
        except Exception as e:  # the daemon raises several types for unreachable or unknown peers
            raise DialError(
                f"cannot open a {protocol} stream to {peer_id}: {e or type(e).__name__}"
            ) from None
        return reader, writer
