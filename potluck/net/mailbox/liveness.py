"""The mailbox's side of a peer dying: is a peer whose stream ended still there?

A killed process's streams end at once (its connections are reset), long before anyone's wait for it
runs out. The mailbox (``box.py``) then checks whether the peer still accepts a connection; a peer
that does not fails every wait on it at once, is remembered as gone for ``GONE_MEMORY_S``, and the
plan's other peers are told (a GONE message), since those it never sent anything would otherwise wait
out their bound. This is that check, as a part of ``Mailbox`` (a mixin: it reads the mailbox's waits).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from hivemind.p2p import P2P

from potluck.net.dial import AddressBook, reachable
from potluck.net.tags import Round, Stream, Tag, make_tag
from potluck.protocol.errors import WireError

logger = logging.getLogger(__name__)

GONE_CHECK_S = 2.0  # bound on the liveness check of a peer whose stream to us just ended
# For this long after a check found a peer refusing connections, waits on it and sends to it fail at
# once, with no second check and no dial (seconds). Churn run Q: a leader that had found a peer dead
# waited 4.7 s more for its vote (a second check) and then dialled it 5 s to deliver the decision.
GONE_MEMORY_S = 10.0


class Liveness:
    """Checks of peers whose streams ended, for ``Mailbox`` (which sets these attributes)."""

    p2p: P2P
    peer_id: str
    addresses: AddressBook | None
    _waiters: dict[tuple[str, Tag], asyncio.Future[bytes]]
    _admitted: frozenset[str] | None
    _epoch: int | None
    _step: int
    _background: set[asyncio.Task[Any]]
    _checks: dict[str, asyncio.Task[None]]  # peer -> its liveness check under way
    _ended: set[str]  # peers whose stream ended and that opened no other since
    _gone: dict[str, float]  # peer -> when a check found it refusing connections (monotonic)
    _told: set[str]  # peers this mailbox told its plan's peers are gone

    def suspect(self, peer: str) -> None:
        raise NotImplementedError

    async def send_quietly(self, peer: str, tag: Tag, payload: bytes) -> str | None:
        raise NotImplementedError

    def _fail_waits(self, match: Callable[[str, Tag], bool], error: WireError) -> int:
        """Fail every wait under way on a message ``match(sender, tag)`` selects; returns how many."""
        failed = 0
        for (p, tag), fut in list(self._waiters.items()):
            if match(p, tag) and not fut.done():
                fut.set_exception(error)
                failed += 1
        return failed

    def _fail_waits_on(self, peer: str, error: WireError) -> int:
        """Fail every wait under way on a message from ``peer``; returns how many."""
        return self._fail_waits(lambda sender, _: sender == peer, error)

    def _check_alive(self, peer: str, tell: bool = True) -> None:
        """A killed process's streams end at once (its connections are reset), long before anyone's wait
        for it runs out: check whether ``peer`` still accepts a connection, and if not, fail the waits on
        it now. A live peer that merely reopened its stream answers at once and nothing happens. With no
        wait on it yet, the end is remembered and the first wait on ``peer`` runs the check."""
        if self.addresses is None or peer in self._checks:
            return
        if not self._waiting_on(peer):
            self._ended.add(peer)
            return
        task = asyncio.create_task(self._check(peer, self.addresses, tell), name=f"alive-{peer[-8:]}")
        self._checks[peer] = task
        task.add_done_callback(lambda _: self._checks.pop(peer, None))

    def _gone_for(self, peer: str) -> float | None:
        """Seconds since a check found ``peer`` refusing connections, within ``GONE_MEMORY_S``; else None."""
        at = self._gone.get(peer)
        if at is None:
            return None
        ago = time.monotonic() - at
        if ago >= GONE_MEMORY_S:
            del self._gone[peer]  # check again: it may have come back
            return None
        return ago

    def _waiting_on(self, peer: str) -> bool:
        return any(p == peer and not fut.done() for (p, _), fut in self._waiters.items())

    async def _alive(self, peer: str, addresses: AddressBook) -> bool:
        """Whether ``peer`` accepts a connection: first over the route our daemon already knows (a peer
        whose stream just ended was connected a moment ago), then at the addresses its heartbeat
        announced, each within ``GONE_CHECK_S``. The DHT read of those runs meanwhile: on a busy machine
        it took over 2 s (churn run S: a leader told that a peer was gone gave up on the check and
        waited out its 5 s step bound)."""
        lookup = asyncio.create_task(asyncio.wait_for(addresses(peer), GONE_CHECK_S))
        try:
            if await reachable(self.p2p, peer, [], GONE_CHECK_S):
                return True
            try:
                maddrs = await lookup
            except (TimeoutError, WireError):
                return False  # the known route refused and nothing else is known in time
            return bool(maddrs) and await reachable(self.p2p, peer, maddrs, GONE_CHECK_S)
        finally:
            lookup.cancel()

    async def _check(self, peer: str, addresses: AddressBook, tell: bool = True) -> None:
        alive = await self._alive(peer, addresses)
        if alive:
            self._ended.discard(peer)
            self._gone.pop(peer, None)
            return
        # Still gone: waits and sends fail at once for GONE_MEMORY_S, then the next wait checks again
        # (it may have come back; a stream it opens to us clears the verdict at once).
        self._ended.add(peer)
        self._gone[peer] = time.monotonic()
        self.suspect(peer)
        gone = WireError(f"{peer} is gone: its stream ended and it refuses connections")
        failed = self._fail_waits_on(peer, gone)
        logger.info(
            "%s is gone (its stream ended, it refuses connections): %d wait(s) failed now", peer, failed
        )
        if tell:
            self._tell_gone(peer)

    def _tell_gone(self, peer: str) -> None:
        """Tell the plan's other peers that ``peer`` is gone: those whose streams from it did not end (it
        never sent them anything this epoch, e.g. a step's leader) would otherwise wait out their bound
        (run N: a leader noticed a death 5 s after the victim's neighbours). Each checks for itself
        (``_on_gone``); only the peer that saw the stream end tells, so a death costs one message per peer."""
        if self._admitted is None or peer in self._told:
            return
        self._told.add(peer)
        tag = make_tag(Round(self._epoch or 0, self._step), Stream.GONE)
        for other in sorted(self._admitted - {self.peer_id, peer}):
            task = asyncio.create_task(self.send_quietly(other, tag, peer.encode()), name="gone")
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _on_gone(self, sender: str, tag: Tag, payload: bytes) -> None:
        """``sender`` says a peer of the plan is gone: check it ourselves (a connection attempt) if we wait
        on it, else remember its stream as ended so the next wait checks it. A lie costs one check."""
        try:
            peer = payload.decode("ascii")
        except UnicodeDecodeError:
            return
        if peer == self.peer_id or self._admitted is None or peer not in self._admitted:
            return
        self._ended.add(peer)
        self._check_alive(peer, tell=False)
