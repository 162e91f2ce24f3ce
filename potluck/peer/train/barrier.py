"""The start barrier: no peer runs a plan's first step until every peer of the plan holds its state.

Peers of a new plan take their state at different times (from memory in a millisecond, from another
peer's disk over a home link in minutes), so without a barrier the first step itself must wait for the
slowest of them, and every wait of that step needs the long bound a state fetch needs. A death inside
that first step (the common case under churn: the kill that caused the plan was followed by another)
then goes unnoticed until the victim's heartbeat expires. With the barrier, only this one exchange
carries the long bound; the first step runs under the measured step budget like any other.

Protocol, under the round (plan epoch, start step): each peer sends START_READY to the plan's leader
once it holds its state (or once it failed to take it, with the reason); the leader waits for all of
them (``wait_s``), then sends START_GO to all: go, or a no-go saying why (a peer that failed, or the
peers that never came: gone, or without state in time). Every peer names those in its failure report
as suspects, so the coordinator checks them (heartbeat, direct probe) whichever report it reads first.
A peer waits for the leader's answer at most twice as long (the leader may start late), and re-sends its
READY every ``RESEND_S`` meanwhile: a receiver that did not follow the plan yet refuses it without the
sender knowing (seen: a peer moving between jobs, docs/multijob.md, refused its new leader's peer's
READY while it still trained the job it left, and the plan waited out its whole barrier).
"""

from __future__ import annotations

import asyncio
import json
import logging

from potluck.net.mailbox import Mailbox
from potluck.net.tags import Round, Stream, Tag, make_tag
from potluck.peer.collectives.rounds import announce, collect
from potluck.peer.errors import StartError
from potluck.protocol.errors import WireError
from potluck.protocol.training import TrainPlan

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 4 * 1024  # a ready or a go/no-go: a flag and a short reason
MAX_NAMED = 16  # missing peers named in a no-go
REASON_CHARS = 1000
RESEND_S = 5.0  # a READY is re-sent this often until the leader's answer comes (duplicates are dropped)


async def start_barrier(box: Mailbox, plan: TrainPlan, wait_s: float, failed: str | None = None) -> None:
    """Return once every peer of ``plan`` holds its starting state; raises ``StartError`` otherwise.
    ``failed``: this peer could not take its state (the reason); the others learn it at once instead
    of waiting out ``wait_s``, and this call returns (the caller raises its own error)."""
    peers = [p for st in plan.stages for p in st.peers]
    me, leader = box.peer_id, plan.leader
    if len(peers) <= 1:
        return
    rnd = Round(plan.epoch, plan.start_step)
    tag_ready, tag_go = make_tag(rnd, Stream.START_READY), make_tag(rnd, Stream.START_GO)
    if me != leader:
        mine = json.dumps({"ok": failed is None, "reason": (failed or "")[:REASON_CHARS]}).encode()
        resend: asyncio.Task[None] | None = None
        try:
            await box.send(leader, tag_ready, mine)
            if failed is not None:
                return
            resend = asyncio.create_task(_resend(box, leader, tag_ready, mine))
            data = await box.recv(leader, tag_go, 2 * wait_s)
        except WireError as e:
            if failed is not None:
                return
            raise StartError(f"start barrier: no answer from the leader {leader}: {e}") from None
        finally:
            if resend is not None:
                resend.cancel()
                await asyncio.gather(resend, return_exceptions=True)
        go, reason = _parse(data, leader, "go")
        if not go:
            # the peers the leader did not hear from: named in this peer's failure report as well, so the
            # coordinator checks them whichever report reaches it first
            for peer in _missing(data, set(peers) - {me, leader}):
                box.suspect(peer)
            raise StartError(f"start barrier: {reason}")
        return
    others = [p for p in peers if p != me]
    reason = f"the leader {me} could not take its state: {failed}" if failed is not None else ""
    missing: list[str] = []
    if not reason:
        reason, missing = await _collect(box, others, tag_ready, wait_s)
    answer = json.dumps({"go": not reason, "reason": reason[:REASON_CHARS], "missing": missing}).encode()
    await announce(box, others, tag_go, answer, "start barrier: answer")
    if reason and failed is None:
        raise StartError(f"start barrier: {reason}")


async def _resend(box: Mailbox, leader: str, tag: Tag, payload: bytes) -> None:
    """Re-send this peer's READY every ``RESEND_S`` until cancelled (the leader's answer came)."""
    while True:
        await asyncio.sleep(RESEND_S)
        try:
            await box.send(leader, tag, payload)
        except WireError as e:  # the recv that runs beside this decides when the leader is gone
            logger.debug("start barrier: READY not re-sent to %s: %s", leader, e)


async def _collect(box: Mailbox, others: list[str], tag: Tag, wait_s: float) -> tuple[str, list[str]]:
    """The leader's wait for every READY: ("", []) when all came and say ok, else (why not, the peers
    not heard from), at the first peer that failed, not after the others' waits."""

    def parse(peer: str, data: bytes) -> str:
        """ "" when ``peer`` holds its state, else why not."""
        try:
            ok, why = _parse(data, peer, "ok")
        except StartError as e:
            return str(e)
        return "" if ok else f"{peer} could not take its state: {why}"

    got = await collect(box, others, tag, wait_s, parse, lambda r: any(r.got.values()))
    # a peer not heard from: box.recv named it a suspect, so the coordinator checks its heartbeat
    missing = sorted(got.failed)
    failed = next((why for why in got.got.values() if why), "")
    if failed:
        return failed, missing[:MAX_NAMED]
    if missing:
        named = missing[:MAX_NAMED]
        return f"no READY from {named} (gone, or no state within {wait_s:.0f} s)", named
    return "", []


def _missing(data: bytes, known: set[str]) -> list[str]:
    """The peers a no-go names as not heard from, kept only if they are peers of the plan."""
    try:
        named = json.loads(data).get("missing", [])
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return []
    if not isinstance(named, list):
        return []
    return [p for p in named[:MAX_NAMED] if isinstance(p, str) and p in known]


def _parse(data: bytes, who: str, flag: str) -> tuple[bool, str]:
    """A barrier message, checked: a small JSON object with a boolean ``flag`` and a reason string."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise StartError(f"start barrier: message from {who} is {len(data)} bytes")
    try:
        obj = json.loads(data)
        value, reason = obj[flag], obj.get("reason", "")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        raise StartError(f"start barrier: malformed message from {who}") from None
    if not isinstance(value, bool) or not isinstance(reason, str):
        raise StartError(f"start barrier: malformed message from {who}")
    return value, reason[:REASON_CHARS]
