"""Partial participation in the coded outer sync: ``sync.policy = "deadline"`` with ``compression.outer``.

On home links one replica's upload can hold a whole stage's outer sync: its payloads reach the others
last. Under the deadline policy the stage's first replica in plan order (the leader) waits for the
others' payloads at most ``deadline_s`` after its own are ready, then names the replicas whose payloads
all came in time (``Stream.GATHER_DECISION``: a bitmask, the leader always in it). Every replica then
takes the outer step on the mean of exactly those payloads (it waits for any it does not hold yet):
the same bytes in the same order, so the replicas stay bit-identical. A replica left out adds what it
sent back into its error-feedback residual (``DiLoCo.left_out``), so its work is not lost but sent
at the next sync, as SparseLoCo and DiLoCo's partial participation treat a late worker.

A payload over its part's bound keeps its sender out of the decision (the leader refuses it, as
``allgather`` does). The decision comes from the leader, as under the per-step deadline policy
(``train/straggle.py``); a leader that names a replica whose payloads some member cannot get fails
that member's sync within ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from potluck.net.mailbox import Mailbox
from potluck.net.tags import Stream, Tag, make_tag
from potluck.peer.collectives.gather import check_own, receive_parts, send_parts
from potluck.peer.collectives.rounds import announce
from potluck.peer.errors import CollectiveError, ContributionError
from potluck.protocol.errors import WireError

logger = logging.getLogger(__name__)


def encode_members(members: Sequence[int], n: int) -> bytes:
    """A bitmask of ``n`` bits, bit i set for each member index i."""
    mask = bytearray((n + 7) // 8)
    for i in members:
        mask[i // 8] |= 1 << (i % 8)
    return bytes(mask)


def decode_members(data: bytes, n: int) -> list[int]:
    """The member indices of a decision; ``ValueError`` for a mask of the wrong size, with bits past
    ``n`` or without the leader (index 0)."""
    if len(data) != (n + 7) // 8:
        raise ValueError(f"a decision for {n} replicas has {(n + 7) // 8} bytes, not {len(data)}")
    members = [i for i in range(8 * len(data)) if data[i // 8] >> (i % 8) & 1]
    if not members or members[0] != 0 or members[-1] >= n:
        raise ValueError(f"decision names replicas {members} of {n}, without the leader or past the group")
    return members


async def allgather_by_deadline(
    box: Mailbox,
    peers: Sequence[str],
    round_no: int,
    payloads: Sequence[bytes],
    bounds: Sequence[int],
    timeout_s: float,
    deadline_s: float,
) -> tuple[list[int], list[list[bytes]]]:
    """(the indices of the replicas in this sync, their payloads in that order). Every member sends
    its payloads to every other member; ``peers[0]`` decides who is in after at most ``deadline_s``;
    the whole exchange takes at most ``timeout_s`` or raises ``CollectiveError``."""
    me = box.peer_id
    if me not in peers:
        raise CollectiveError(f"peer {me} is not in this all-gather group")
    check_own(payloads, bounds)
    n, mine = len(peers), peers.index(me)
    start = time.monotonic()
    deadline = start + timeout_s
    others = [i for i in range(n) if i != mine]
    sends = [asyncio.create_task(send_parts(box, peers[i], round_no, payloads)) for i in others]
    recvs = {i: asyncio.create_task(receive_parts(box, peers[i], round_no, bounds, deadline)) for i in others}
    tag = make_tag(round_no, Stream.GATHER_DECISION)
    try:
        if mine == 0:
            members = await _lead(box, peers, tag, recvs, min(deadline_s, timeout_s), deadline_s)
        else:
            members = await _decision(box, peers[0], tag, n, max(0.0, deadline - time.monotonic()))
        wanted = [recvs[i] for i in members if i != mine]
        done, pending = await asyncio.wait(wanted, timeout=max(0.0, deadline - time.monotonic()) + 1.0)
        for task in done:
            task.result()  # raises a member's refused or missing payload
        if pending:
            raise CollectiveError(f"outer sync: the decided replicas' payloads took over {timeout_s:.1f} s")
        if mine in members:  # the others take the step on our payloads too: let them arrive
            await asyncio.wait(sends, timeout=max(0.0, deadline - time.monotonic()))
    except WireError as e:
        raise CollectiveError(f"outer sync: the decision of {peers[0]} did not go through: {e}") from None
    finally:
        tasks: list[asyncio.Task[Any]] = [*sends, *recvs.values()]
        for task in tasks:
            if not task.done():
                task.cancel()
        for task in tasks:  # retrieve what the refused ones raised
            if task.done() and not task.cancelled():
                task.exception()
    return members, [list(payloads) if i == mine else recvs[i].result() for i in members]


async def _lead(
    box: Mailbox,
    peers: Sequence[str],
    tag: Tag,
    recvs: dict[int, asyncio.Task[list[bytes]]],
    wait_s: float,
    deadline_s: float,
) -> list[int]:
    """The leader's part: wait ``wait_s`` for the others' payloads, then tell everyone who is in."""
    if recvs:
        await asyncio.wait(list(recvs.values()), timeout=wait_s)
    members = [0, *sorted(i for i, t in recvs.items() if t.done() and t.exception() is None)]
    late = [peers[i][-8:] for i in recvs if i not in members]
    if late:
        logger.info("outer sync: left out %s (not in by the %.1f s deadline)", ", ".join(late), deadline_s)
    # a replica the decision does not reach fails its own sync; this one goes on
    await announce(
        box,
        [peers[i] for i in sorted(recvs)],
        tag,
        encode_members(members, len(peers)),
        "outer sync: the decision",
    )
    return members


async def _decision(box: Mailbox, leader: str, tag: Tag, n: int, timeout_s: float) -> list[int]:
    try:
        data = await box.recv(leader, tag, timeout_s)
    except WireError as e:
        raise CollectiveError(f"outer sync: no decision from {leader}: {e}") from None
    try:
        return decode_members(data, n)
    except ValueError as e:
        raise ContributionError(leader, f"outer sync: the decision of {leader} is malformed: {e}") from None
