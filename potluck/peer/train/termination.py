"""When the leader dies inside a commit: ask the other peers what it told them.

Two-phase commit (``commit.py``) has one gap: a leader that dies after some of its COMMITs left. Those
peers apply the step; the rest hear nothing and drop it, so the pipeline's stages stand one step apart
and no step is held by every layer any more. Churn run C (issue 38): stage 1 applied step 3228, the
surviving stage-0 replica held 3227, and the swarm went back 400 steps to an older state it still held.

This closes it the way two-phase commit's cooperative termination does. A peer whose wait for the
decision failed asks every other peer of the plan (the leader aside) what the leader told it. A peer
answers once its own wait for that decision is over, so a COMMIT still on its way to it is never
answered "nothing": with the decision exactly as the leader sent it, or an empty answer. The leader
signs each decision (its Ed25519 key, over the job, the round and the decision's bytes), so a relayed
decision is the leader's own: a peer can withhold one (as a dead peer would) but not forge one. The asker
applies the first decision that verifies and aborts when no peer it can reach got one. While the leader
lives this costs one signature per step on the leader (about 0.05 ms) and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import OrderedDict

from potluck.net.mailbox import Mailbox
from potluck.net.tags import Round, Stream, Tag, make_tag
from potluck.peer.collectives.rounds import announce, collect
from potluck.protocol.errors import WireError
from potluck.protocol.identity import (
    SIGNATURE_BYTES,
    Identity,
    IdentityError,
    public_key_from_peer_id,
    verify,
)
from potluck.protocol.training import TrainPlan

logger = logging.getLogger(__name__)

# The commit's own stream kinds: a step its leader aborted still brings each peer its verdict on them.
COMMIT_KINDS = frozenset(
    int(k) for k in (Stream.COMMIT_READY, Stream.COMMIT_DECISION, Stream.COMMIT_ASK, Stream.COMMIT_ANSWER)
)
MAX_ABORT_BYTES = 512  # a STEP_ABORT's reason
KEEP_ROUNDS = 8  # decisions remembered for questions (rounds); a question comes within one step
MAX_ANSWERED = 4096  # (asker, round) pairs answered, remembered so that each is answered once
UNSIGNED = bytes(SIGNATURE_BYTES)  # a leader without a key: its decisions cannot be relayed


class Decisions:
    """One plan's commit decisions as this peer got them, for the peers that missed theirs.

    Built once per training run (``Trainer``); it answers the plan's questions (``Mailbox.serve``) from
    then on. ``seal``/``open`` are the decision's wire form; ``waiting``/``settle`` bracket this peer's
    own wait for a decision; ``ask`` is the question a peer that missed one puts to the others."""

    def __init__(self, box: Mailbox, plan: TrainPlan, identity: Identity | None) -> None:
        self.box, self.plan, self.identity = box, plan, identity
        self._outcomes: OrderedDict[int, asyncio.Future[bytes]] = OrderedDict()  # round -> sealed or b""
        self._answered: set[tuple[str, int]] = set()
        self._tasks: set[asyncio.Task[object]] = set()
        box.serve(Stream.COMMIT_ASK, 0, self._on_ask)
        box.serve(Stream.STEP_ABORT, MAX_ABORT_BYTES, self._on_abort)

    # ---- the decision's wire form: signature, then the decision's bytes -----------------------------

    def _signed_bytes(self, rnd: int, body: bytes) -> bytes:
        return b"potluck/commit\0" + self.plan.job.encode() + struct.pack(">Q", rnd) + body

    def seal(self, rnd: Round, body: bytes) -> bytes:
        """The leader's decision on the wire: its signature (zeros without a key), then ``body``."""
        if self.identity is None:
            return UNSIGNED + body
        return self.identity.sign(self._signed_bytes(rnd.pack(), body)) + body

    def open(self, rnd: Round, data: bytes, who: str, relayed: bool = False) -> bytes:
        """The decision's bytes from a sealed decision; ``relayed`` (from a peer other than the leader):
        only when the leader's signature over this job and round verifies, else ``WireError``."""
        if len(data) < SIGNATURE_BYTES:
            raise WireError(f"commit decision from {who} is {len(data)} bytes, shorter than its signature")
        sig, body = data[:SIGNATURE_BYTES], data[SIGNATURE_BYTES:]
        if relayed:
            try:
                key = public_key_from_peer_id(self.plan.leader)
            except IdentityError:
                raise WireError(f"the leader's decision relayed by {who} cannot be checked") from None
            if not verify(key, self._signed_bytes(rnd.pack(), body), sig):
                raise WireError(f"decision relayed by {who} is not signed by the leader for {rnd}")
        return body

    # ---- this peer's own wait ------------------------------------------------------------------------

    def waiting(self, rnd: Round) -> None:
        """This peer now waits for the leader's decision of ``rnd``: questions about it wait for the end."""
        self._outcomes[rnd.pack()] = asyncio.get_running_loop().create_future()
        while len(self._outcomes) > KEEP_ROUNDS:
            self._outcomes.popitem(last=False)

    def settle(self, rnd: Round, sealed: bytes | None) -> None:
        """The wait for ``rnd`` ended: with the leader's sealed decision, or None (nothing came)."""
        fut = self._outcomes.get(rnd.pack())
        if fut is not None and not fut.done():
            fut.set_result(sealed or b"")

    # ---- the leader's early abort --------------------------------------------------------------------

    def _on_abort(self, sender: str, tag: Tag, payload: bytes) -> None:
        """The leader says a step of this plan will not commit (it heard a failure, ``commit.py``): this
        peer's waits on that step's other messages fail now (``Mailbox.abort_step``), so it reaches the
        commit, and the ABORT already waiting there, at once. Another peer of the plan says its own step
        failed (``give_up``): only the waits on its messages fail, which is all a peer that stops
        sending could cause anyway. From anyone else it is ignored."""
        rnd = Round.unpack(tag.round)
        if rnd.epoch != self.plan.epoch or sender not in self.plan.peers:
            return
        said = payload.decode("utf-8", "replace")
        if sender == self.plan.leader:
            failed = self.box.abort_step(
                rnd.epoch, rnd.step, f"the leader aborted step {rnd.step}: {said}", COMMIT_KINDS
            )
            logger.info("step %d aborted by the leader: %d wait(s) failed now", rnd.step, failed)
        else:
            why = f"{sender} gave step {rnd.step} up: {said}"
            failed = self.box.abort_step(rnd.epoch, rnd.step, why, COMMIT_KINDS, sender=sender)
            logger.info("step %d given up by %s: %d wait(s) on it failed now", rnd.step, sender, failed)

    def give_up(self, rnd: Round, why: str, to: list[str | None]) -> None:
        """This peer's step ``rnd`` failed: tell the peers that may be waiting on its messages (``to``:
        its pipeline neighbours and its stage's replicas) so that they stop now. Run L: a stage-1 replica
        whose all-reduce partner was killed stopped inside its backward, and the leader, its pipeline
        neighbour, waited 2 s for the gradients it would never send, in its compute, out of reach of
        the leader's early abort; the repair then started behind the survivors. Sent in the background:
        a neighbour that died must not hold this peer's failed READY up."""
        told = why.encode()[:MAX_ABORT_BYTES]
        others = [p for p in dict.fromkeys(to) if p is not None and p != self.box.peer_id]
        tag = make_tag(rnd, Stream.STEP_ABORT)
        task = asyncio.create_task(announce(self.box, others, tag, told, "step given up"), name="give-up")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- answering ----------------------------------------------------------------------------------

    def _on_ask(self, sender: str, tag: Tag, payload: bytes) -> None:
        """A question from ``sender`` about round ``tag.round``: answered once per asker and round, after
        this peer's own wait for it ends (at most the transport's bound); a round this peer has no wait
        for (not reached, or forgotten) gets the empty answer at once."""
        key = (sender, tag.round)
        if sender not in self.plan.peers or sender == self.box.peer_id or key in self._answered:
            return
        if len(self._answered) >= MAX_ANSWERED:
            self._answered.clear()
        self._answered.add(key)
        task = asyncio.create_task(self._answer(sender, tag.round), name="commit-answer")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, sender: str, rnd: int) -> None:
        fut = self._outcomes.get(rnd)
        sealed = b""
        if fut is not None:
            try:
                sealed = await asyncio.wait_for(asyncio.shield(fut), self.box.cfg.timeout_s)
            except TimeoutError:
                sealed = b""
        why = await self.box.send_quietly(sender, make_tag(rnd, Stream.COMMIT_ANSWER), sealed)
        if why is not None:
            logger.info("answer about round %s not delivered to %s: %s", Round.unpack(rnd), sender, why)

    # ---- asking -------------------------------------------------------------------------------------

    async def ask(self, rnd: Round, timeout_s: float) -> bytes | None:
        """The leader's decision of ``rnd`` as another peer got it (its bytes, verified), or None when no
        peer this one can reach got one. Each answer waits at most ``timeout_s``."""
        me, leader = self.box.peer_id, self.plan.leader
        others = sorted(p for p in self.plan.peers if p not in (me, leader))
        if not others:
            return None
        unreached = await announce(
            self.box, others, make_tag(rnd, Stream.COMMIT_ASK), b"", "question about the commit"
        )
        asked = [p for p in others if p not in unreached]

        def parse(peer: str, data: bytes) -> bytes | None:
            return self.open(rnd, data, peer, relayed=True) if data else None

        got = await collect(
            self.box,
            asked,
            make_tag(rnd, Stream.COMMIT_ANSWER),
            timeout_s,
            parse,
            lambda r: any(v is not None for v in r.got.values()),
        )
        for why in got.failed.values():
            logger.info("question about the commit of %s: %s", rnd, why)
        found = [(p, v) for p, v in got.got.items() if v is not None]
        if found:
            logger.warning("the leader %s gave no decision for %s; %s relayed it", leader, rnd, found[0][0])
            return found[0][1]
        return None
