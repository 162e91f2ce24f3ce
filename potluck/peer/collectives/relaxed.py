"""Deadline-based partial participation with all-or-nothing agreement.

Policy (its effect on the update): contributions that are not ready by the deadline are dropped for this
round, and every member receives the SAME mean over the contributors (weights renormalised to 1/|members|
each). A dropped peer learns so (``LateError``); in training it then applies the committed mean the
leader sends it (``peer/train/straggle.py``).

Protocol, per attempt, with the group's first peer as the round's leader:

1. READY: every peer tells the leader it has its contribution.
2. DECISION: at the deadline (or once all are ready) the leader sends the member list to the members.
3. the members run the tree all-reduce over the schedule restricted to them (``restrict``);
4. DONE / VERDICT: each member reports success to the leader; the leader answers COMMIT only if every
   member succeeded, else RETRY, and the members that are still alive run a new attempt.

Nobody returns a result before COMMIT, so a peer that dies mid-collective leaves every survivor either
with the identical renormalised mean of a later attempt or, when the leader itself is lost or the
attempts run out, with the same ``CollectiveError``. Never a mix of old and new values.

Attempt a of round r runs under ``r.retry(a)`` (``net/tags.py``), control messages on their own streams;
afterwards the mailbox forgets exactly ``r.attempts()``, so late messages of this round go while those
of later steps, and of collectives running in other phases of the same step, stay.
"""

from __future__ import annotations

import logging

import msgpack
import torch

from potluck.net.mailbox import Mailbox
from potluck.net.tags import ATTEMPTS, Round, Stream, make_tag
from potluck.peer.collectives.robust import Audit
from potluck.peer.collectives.rounds import announce, collect, raw
from potluck.peer.collectives.tree import tree_allreduce
from potluck.peer.config import AllReduceConfig, RelaxedConfig
from potluck.peer.errors import CollectiveError, LateError
from potluck.protocol.collective import AllReduceSchedule, restrict
from potluck.protocol.errors import WireError

logger = logging.getLogger(__name__)


async def relaxed_allreduce(
    box: Mailbox,
    schedule: AllReduceSchedule,
    tensor: torch.Tensor,
    rnd: Round,
    cfg: AllReduceConfig,
    relax: RelaxedConfig,
    audit: Audit | None = None,
) -> tuple[torch.Tensor, tuple[str, ...]]:
    """Mean of ``tensor`` over this round's contributors, identical on each; returns (mean, members).

    ``rnd`` is the round's first attempt; the later attempts are numbered from it."""
    me, leader = box.peer_id, schedule.peers[0]
    if relax.max_attempts > ATTEMPTS:
        raise ValueError(f"max_attempts is limited to {ATTEMPTS} (the attempt bits of a message tag)")
    if rnd.attempt != 0:
        raise ValueError(f"relaxed rounds number their own attempts: pass attempt 0, not {rnd.attempt}")
    alive = list(schedule.peers)
    try:
        for attempt in range(relax.max_attempts):
            tag_round = rnd.retry(attempt).pack()
            if me == leader:
                members = await _collect_ready(box, alive, tag_round, relax.deadline_s)
                if len(members) < relax.min_members:
                    members = []  # tell everyone the round is off
                decision = make_tag(tag_round, Stream.RELAXED_DECISION)
                await announce(
                    box, [p for p in alive if p != me], decision, msgpack.packb(members), "members"
                )
                if not members:
                    raise CollectiveError(f"round {rnd}: only {len(members)} contributors")
            else:
                await box.send(leader, make_tag(tag_round, Stream.RELAXED_READY), b"")
                data = await box.recv(
                    leader, make_tag(tag_round, Stream.RELAXED_DECISION), relax.deadline_s + cfg.timeout_s
                )
                members = list(msgpack.unpackb(data))
                if not members:
                    raise CollectiveError(f"round {rnd}: too few contributors")
                if me not in members:
                    raise LateError(f"round {rnd}: contribution missed the {relax.deadline_s:.1f} s deadline")
            result: torch.Tensor | None = None
            try:
                result = await tree_allreduce(box, restrict(schedule, members), tensor, tag_round, cfg, audit)
            except CollectiveError as e:
                logger.info("round %s attempt %d failed at %s: %s", rnd, attempt, me, e)
            if me == leader:
                failed, silent = await _collect_done(box, members, tag_round, 2 * cfg.timeout_s)
                verdict = b"commit" if result is not None and not failed else b"retry"
                told = [p for p in members if p != me and p not in silent]
                await announce(box, told, make_tag(tag_round, Stream.RELAXED_VERDICT), verdict, "verdict")
                # Peers that reported a failure are alive (hit by someone else's); the silent are gone.
                alive = [p for p in members if p not in silent]
            else:
                await box.send(
                    leader, make_tag(tag_round, Stream.RELAXED_DONE), b"ok" if result is not None else b"fail"
                )
                verdict_tag = make_tag(tag_round, Stream.RELAXED_VERDICT)
                verdict = await box.recv(leader, verdict_tag, 3 * cfg.timeout_s)
            if verdict == b"commit":
                assert result is not None  # the leader commits only when every member succeeded
                return result, tuple(members)
        raise CollectiveError(f"round {rnd}: no attempt of {relax.max_attempts} completed")
    except WireError as e:  # the leader is unreachable: the same failure for everyone who depends on it
        raise CollectiveError(f"round {rnd}: lost the round's leader {leader}: {e}") from None
    finally:
        await box.forget(rnd.attempts())


async def _collect_ready(box: Mailbox, peers: list[str], tag_round: int, deadline_s: float) -> list[str]:
    """Members of this attempt: the leader plus every peer whose READY arrives before the deadline."""
    others = [p for p in peers if p != box.peer_id]
    got = await collect(box, others, make_tag(tag_round, Stream.RELAXED_READY), deadline_s, raw)
    return [p for p in peers if p == box.peer_id or p in got.got]


async def _collect_done(
    box: Mailbox, members: list[str], tag_round: int, timeout_s: float
) -> tuple[set[str], set[str]]:
    """(members that failed or went silent, members that went silent) in this attempt, leader excluded."""
    others = [p for p in members if p != box.peer_id]
    got = await collect(box, others, make_tag(tag_round, Stream.RELAXED_DONE), timeout_s, raw)
    silent = set(got.failed)
    return silent | {p for p, done in got.got.items() if done != b"ok"}, silent
