"""The leader's round, written once: collect one message from each of a set of peers, each wait bounded,
until a rule says enough; then announce one answer to all of them.

Every control exchange of a step has this shape, with the plan's (or the group's) first peer as the
leader: the step commit (``train/commit.py``: READYs until every member the decision needs is in, then
the decision), the start barrier (``train/barrier.py``: READYs, stopping at the first peer that could
not take its state, then go or no-go), the relaxed all-reduce (``relaxed.py``: READYs until the
deadline, then the members; DONEs, then the verdict) and partial participation in the outer sync
(``partial.py``: the members, announced). What differs is how a reply is read and when the round has
enough; the bookkeeping (one task per peer, their cancellation, what a failure counts as) is here.

A peer whose message does not come within the bound, or whose stream fails, is ``failed`` with the
reason (the mailbox names it a suspect); a reply the caller's ``parse`` refuses raises the caller's
error, or is recorded as a failure when ``parse`` raises ``WireError``. Waits still running when the rule
stops the round are cancelled: their messages stay buffered in the mailbox until it forgets the round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from potluck.net.mailbox import Mailbox
from potluck.net.tags import Tag
from potluck.protocol.errors import WireError

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class Replies(Generic[T]):
    got: dict[str, T] = field(default_factory=dict)  # peer -> its reply, as ``parse`` read it
    failed: dict[str, str] = field(default_factory=dict)  # peer -> why nothing usable came
    pending: list[str] = field(default_factory=list)  # peers still awaited when the rule stopped the round


def raw(peer: str, data: bytes) -> bytes:
    """``parse`` for a reply taken as it came."""
    return data


async def collect(
    box: Mailbox,
    peers: Sequence[str],
    tag: Tag,
    timeout_s: float,
    parse: Callable[[str, bytes], T],
    enough: Callable[[Replies[T]], bool] | None = None,
) -> Replies[T]:
    """One message under ``tag`` from each of ``peers`` (each wait at most ``timeout_s``), read by
    ``parse(peer, data)``; returns once all are in or failed, or as soon as ``enough(replies)`` holds."""
    out: Replies[T] = Replies()

    async def one(peer: str) -> tuple[str, T | None, str]:
        try:
            return peer, parse(peer, await box.recv(peer, tag, timeout_s)), ""
        except WireError as e:
            return peer, None, str(e) or type(e).__name__

    waits = {asyncio.create_task(one(p)): p for p in peers}
    try:
        while waits and not (enough is not None and enough(out)):
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                del waits[task]
                peer, reply, why = task.result()
                if why:
                    out.failed[peer] = why
                else:
                    out.got[peer] = reply  # type: ignore[assignment]
    finally:
        for task in waits:
            task.cancel()
        out.pending = [p for p in peers if p not in out.got and p not in out.failed]
    return out


async def announce(
    box: Mailbox, peers: Sequence[str], tag: Tag, payload: bytes, what: str, level: int = logging.INFO
) -> list[str]:
    """Send ``payload`` to every peer at once; a peer it cannot reach is that peer's loss (logged at
    ``level`` as ``what`` not delivered, and returned), never the round's."""
    reasons = await asyncio.gather(*(box.send_quietly(p, tag, payload) for p in peers))
    for p, why in zip(peers, reasons, strict=True):
        if why is not None:
            logger.log(level, "%s not delivered to %s: %s", what, p, why)
    return [p for p, why in zip(peers, reasons, strict=True) if why is not None]
