"""All-gather of coded payloads over the peer mailbox: DiLoCo's coded outer sync (issue 22).

Coded sparse or 2-bit pseudo-gradients of different replicas do not add up into a payload of the same
codec, so instead of an all-reduce every member of a stage sends its payloads (one per part of the flat
pseudo-gradient) to every other member, and every member decodes all of them in the group's order: each
replica then averages the same bytes in the same order and applies a bit-identical outer step.

Messages: stream kind ``GATHER``, the step's round in phase ``OUTER``, chunk = the part. Each replica
uploads (members - 1) copies of its payloads: against a dense fp32 ring all-reduce (2 (N - 1) / N x 4
bytes per parameter each way) this pays off for small stages and small payloads, which is what the
coded outer sync is for.

What is refused, and how: the mailbox bounds every message (its TENSOR limit and per-sender quota)
and admits only the plan's peers; here only the group's members are listened to, so a payload from
anyone else under the same tag is never claimed. A payload longer than its part's bound
(``payload_bound``: what any honest encoder of that codec can produce) is refused before anything is
decoded, and a missing one fails the wait when ``timeout_s`` (for the whole gather) runs out. Either way
the gather raises (``ContributionError`` / ``CollectiveError`` naming the peer): the sync fails cleanly
on every replica that sees the fault, the step is not completed and the job resumes from its last
checkpoint under a new plan, like a failed dense outer all-reduce. Leaving the faulty replica out of the
mean instead would need every replica to agree on who was left out (a forger can send different bytes
to different replicas); failing is what keeps the replicas identical without another round of votes.

Robust rules (``trust.aggregation`` trimmed_mean or centered_clip) weigh the decoded contributions
against each other, so every replica must weigh the *same* bytes. ``echo`` adds that check: each member
sends every other member the SHA-256 of each member's payloads as it received them (32 bytes per member),
and a member whose view differs from another's on any payload fails the sync (``CollectiveError``). Two
honest members always see each other's true view, so a forger that sends different bytes to different
replicas cannot split them without both noticing; a member that lies in its echo can only make the sync
fail, which costs the step, as any fault does. Which of two members lied cannot be told from one view,
except when a member's echo of its own payload contradicts what it sent: then it is named
(``ContributionError``). After a passed echo, every honest member holds the same
payloads, so a robust rule may leave out undecodable ones and still give every replica the same bits.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Sequence

from potluck.compression import Codec
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Stream, Tag, make_tag
from potluck.peer.errors import CollectiveError, ContributionError
from potluck.protocol.errors import WireError

logger = logging.getLogger(__name__)

GRACE_S = 1.0  # seconds past the deadline a receive has to report its own timeout
BOUND_SLACK_BYTES = 4096  # headers, spec string, section table and checksum of one payload, with room


def payload_bound(codec: Codec, numel: int) -> int:
    """Most bytes an honest payload of ``codec`` for ``numel`` fp32 elements takes: its size before the
    lossless stage (a lossless stage never keeps a section larger than its input), doubled for top-k's
    variable index widths, plus ``BOUND_SLACK_BYTES``."""
    est = codec.estimate_bytes((numel,))
    ratio = codec.lossless.expected_ratio if codec.lossless is not None else 1.0
    return 2 * math.ceil(est * ratio) + BOUND_SLACK_BYTES


def gather_tag(round_no: int, part: int) -> Tag:
    return make_tag(round_no, Stream.GATHER, chunk=part)


DIGEST_BYTES = 32  # SHA-256


def digests(gathered: Sequence[Sequence[bytes]]) -> bytes:
    """One SHA-256 per member over its parts (each length-prefixed), concatenated in group order."""
    out = bytearray()
    for parts in gathered:
        h = hashlib.sha256()
        for data in parts:
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
        out += h.digest()
    return bytes(out)


async def echo(
    box: Mailbox,
    peers: Sequence[str],
    round_no: int,
    gathered: Sequence[Sequence[bytes]],
    timeout_s: float,
    senders: Sequence[str] | None = None,
) -> None:
    """Check that every member gathered the same payloads as this one (see the module docstring): send
    our digests of ``gathered`` (the payloads of ``senders``, by default every member) to every other
    member and compare theirs. Raises ``CollectiveError`` naming the payload the views differ on, or
    the member whose echo did not come or is malformed."""
    senders = peers if senders is None else senders
    me, mine = box.peer_id, digests(gathered)
    others = [p for p in peers if p != me]
    if not others:  # a stage down to one replica (a plan shrunk under churn): nobody to compare with
        return
    tag = make_tag(round_no, Stream.GATHER_ECHO)
    deadline = time.monotonic() + timeout_s

    async def send(peer: str) -> None:
        try:
            await box.send(peer, tag, mine)
        except WireError as e:
            raise CollectiveError(f"outer sync: sending our echo to {peer} failed: {e}") from None

    async def check(peer: str) -> None:
        try:
            theirs = await box.recv(peer, tag, max(0.0, deadline - time.monotonic()))
        except WireError as e:
            raise CollectiveError(f"outer sync: the echo of {peer} did not come: {e}") from None
        if len(theirs) != len(mine):
            raise ContributionError(
                peer, f"outer sync: the echo of {peer} holds {len(theirs)} bytes, not {len(mine)}"
            )
        for c, sender in enumerate(senders):
            at = slice(c * DIGEST_BYTES, (c + 1) * DIGEST_BYTES)
            if theirs[at] != mine[at] and sender == peer:  # both from the same peer: it is the liar
                raise ContributionError(
                    peer, f"outer sync: the echo of {peer} contradicts the payload it sent this replica"
                )
            if theirs[at] != mine[at]:
                raise CollectiveError(
                    f"outer sync: {peer} received other bytes from {sender} than this replica did "
                    f"({sender} sent different payloads to different replicas, or {peer} misreports them)"
                )

    tasks = [asyncio.create_task(send(p)) for p in others] + [asyncio.create_task(check(p)) for p in others]
    try:
        done, pending = await asyncio.wait(
            tasks, timeout=timeout_s + GRACE_S, return_when=asyncio.FIRST_EXCEPTION
        )
        errors = [e for e in (t.exception() for t in done) if e is not None]
        if errors:
            raise errors[0]
        if pending:
            raise CollectiveError(f"outer sync: the echo took over {timeout_s:.1f} s")
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()


def check_own(payloads: Sequence[bytes], bounds: Sequence[int]) -> None:
    """``ValueError`` / ``CollectiveError`` when our own payloads do not fit the parts' bounds (our own
    encoder broke its codec's bound: the others would refuse them)."""
    if len(payloads) != len(bounds):
        raise ValueError(f"{len(payloads)} payloads for {len(bounds)} parts")
    for i, (data, bound) in enumerate(zip(payloads, bounds, strict=True)):
        if len(data) > bound:
            raise CollectiveError(f"own part {i} holds {len(data)} bytes, over its {bound}-byte bound")


async def send_parts(box: Mailbox, peer: str, round_no: int, payloads: Sequence[bytes]) -> None:
    """Our payloads to ``peer``, one message per part."""
    for i, data in enumerate(payloads):
        try:
            await box.send(peer, gather_tag(round_no, i), data)
        except WireError as e:
            raise CollectiveError(f"outer sync: sending part {i} to {peer} failed: {e}") from None


async def receive_parts(
    box: Mailbox, peer: str, round_no: int, bounds: Sequence[int], deadline: float
) -> list[bytes]:
    """``peer``'s payloads, each refused over its part's bound, all by ``deadline`` (monotonic)."""
    got = []
    for i, bound in enumerate(bounds):
        left = max(0.0, deadline - time.monotonic())
        try:
            data = await box.recv(peer, gather_tag(round_no, i), left)
        except WireError as e:
            raise CollectiveError(f"outer sync: part {i} from {peer} did not come: {e}") from None
        if len(data) > bound:
            why = f"outer sync: part {i} from {peer} holds {len(data)} bytes, over its {bound}-byte bound"
            raise ContributionError(peer, why)
        got.append(data)
    return got


async def allgather(
    box: Mailbox,
    peers: Sequence[str],
    round_no: int,
    payloads: Sequence[bytes],
    bounds: Sequence[int],
    timeout_s: float,
) -> list[list[bytes]]:
    """Every member's payloads, in the order of ``peers`` (this peer's own included, as given).

    ``round_no``: a packed ``Round`` shared by the group for this gather; ``bounds[i]``: the most bytes
    part ``i`` may hold. Raises ``CollectiveError`` (``ContributionError`` when a member's payload is
    refused) naming the member; the whole gather takes at most ``timeout_s``."""
    me = box.peer_id
    if me not in peers:
        raise CollectiveError(f"peer {me} is not in this all-gather group")
    check_own(payloads, bounds)
    deadline = time.monotonic() + timeout_s
    others = [p for p in peers if p != me]
    if not others:  # a stage down to one replica: its own payloads are the whole gather
        return [list(payloads)]
    sends = {p: asyncio.create_task(send_parts(box, p, round_no, payloads)) for p in others}
    recvs = {p: asyncio.create_task(receive_parts(box, p, round_no, bounds, deadline)) for p in others}
    tasks = [*sends.values(), *recvs.values()]
    try:
        # the receives end by the deadline on their own (and name the missing peer); the grace lets
        # them, so that only a send stuck past the deadline is reported as one
        wait_s = timeout_s + GRACE_S
        done, pending = await asyncio.wait(tasks, timeout=wait_s, return_when=asyncio.FIRST_EXCEPTION)
        errors = [e for e in (t.exception() for t in done) if e is not None]  # all retrieved
        if errors:
            raise errors[0]
        if pending:
            slow = sorted({p for p in others if sends[p] in pending or recvs[p] in pending})
            raise CollectiveError(f"outer sync: the exchange with {slow} took over {timeout_s:.1f} s")
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
    own = list(payloads)
    return [own if p == me else recvs[p].result() for p in peers]
