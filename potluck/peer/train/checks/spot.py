"""Pipeline spot checks: other replicas of a stage recompute a random micro-batch and compare.

Data-parallel replicas of a stage hold the same weights at every step (synchronous training), so any of
them can redo any other's micro-batch. Once step s is committed, every peer draws the same checks from
the step's decision (its norms and loss, which nobody knows before every activation of the step has
been sent, so a hostile stage cannot tell which micro-batches it had better compute honestly): each
micro-batch of each replica is checked with probability ``trust.spot_checks`` by up to two other
replicas of its stage.

For a check of replica i of stage j, micro-batch m:
- its checkers copy their weights before applying step s (one copy of the stage, only on such steps);
- replica i's pipeline neighbours push the evidence they hold, each piece sealed by its author
  (``peer/seal``): stage j + 1 the activations i sent it and the gradient it sent back to i, stage j - 1
  the activations it sent i and the gradient i sent back; the first stage's input is the checker's data;
- each checker replays the micro-batch on its copy and compares what i sent with what it computed,
  allowing the activation codec's own error plus ``trust.spot_tolerance`` (relative L2).

A mismatch is a failed check in this peer's ``Audit``, published as testimony (``Witness.failed``); the
coordinator convicts when most of the stage's other replicas, and at least two, caught the peer
(``coordinator/job/accuse.py``), so a lone hostile checker cannot get an honest peer banned. Evidence
that does not arrive in time or does not verify leaves the check inconclusive (logged), never failed.
Off under DiLoCo's local steps, where replicas' weights differ between syncs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from potluck.compression import Codec
from potluck.compression.errors import CompressionError
from potluck.model.stage import StageRunner
from potluck.model.transformer import StageModel
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Round, Stream, Tag, make_tag
from potluck.peer.collectives.robust import Audit
from potluck.peer.errors import PeerError, SealError
from potluck.peer.seal import Ledger, check_seal, key_of
from potluck.peer.train.checks.evidence import (
    MAX_CHECKERS,
    Duty,
    check_seed,
    mismatch,
    pack_evidence,
    uniform,
    unpack_evidence,
)
from potluck.peer.train.checks.idle import in_idle_time
from potluck.peer.train.commit import Decision
from potluck.peer.train.pipeline import MicroBatch, link_codecs
from potluck.protocol.errors import WireError
from potluck.protocol.jobspec import TrustSpec
from potluck.protocol.training import TrainPlan

logger = logging.getLogger(__name__)

FROM_NEXT, FROM_PREV = 0, 1  # evidence stream index: pushed by stage j + 1, by stage j - 1


@dataclass(frozen=True)
class Check:
    stage: int
    suspect: int  # the replica whose micro-batch is recomputed
    micro: int
    checkers: tuple[int, ...]  # replicas of the same stage that recompute it


def select_checks(
    seed: bytes, stages: Iterable[int], n_replicas: int, n_micro: int, fraction: float
) -> list[Check]:
    """The checks of ``stages`` for one step: each (replica, micro-batch) with probability ``fraction``,
    each by up to ``MAX_CHECKERS`` other replicas. Pure: the same seed gives every peer the same list."""
    if fraction <= 0 or n_replicas < 2:
        return []
    out = []
    for j in sorted(set(stages)):
        for i in range(n_replicas):
            for m in range(n_micro):
                if uniform(seed, j, i, m) >= fraction:
                    continue
                others = sorted(
                    (k for k in range(n_replicas) if k != i), key=lambda k: uniform(seed, j, i, m, k)
                )
                out.append(Check(j, i, m, tuple(others[:MAX_CHECKERS])))
    return out


class Inconclusive(PeerError):
    """A spot check could not be made: evidence missing, late or not verifiable."""


class SpotChecks(Duty):
    """One trainer's part in the spot checks of its plan: evidence it holds, and checks it makes."""

    def __init__(
        self,
        runner: StageRunner,
        box: Mailbox,
        plan: TrainPlan,
        position: tuple[int, int],
        ledger: Ledger,
        codec: Codec,
        trust: TrustSpec,
        audit: Audit,
        batch: Callable[[int, int], list[MicroBatch]],
        timeout_s: float,
    ) -> None:
        """``batch(step, replica)``: that replica's micro-batches of a step, as its trainer builds them."""
        super().__init__(box)
        self.runner, self.plan, self.ledger, self.codec = runner, plan, ledger, codec
        self.stage, self.replica = position
        self.trust, self.audit, self.batch, self.timeout_s = trust, audit, batch, timeout_s

    async def after_commit(self, rnd: Round, decision: Decision, n_micro: int) -> list[Check]:
        """Step ``rnd`` is committed and not yet applied: push the evidence this peer holds, copy the
        weights for the checks it makes (run in the background). Returns the checks it makes.
        ``n_micro``: the most micro-batches any replica has (the same number on every peer)."""
        n = len(self.plan.stages)
        near = [j for j in (self.stage - 1, self.stage, self.stage + 1) if 0 <= j < n]
        seed = check_seed(self.plan.job, rnd, decision)
        checks = select_checks(seed, near, self.plan.n_replicas, n_micro, self.trust.spot_checks)
        for c in checks:
            if c.suspect == self.replica and c.stage != self.stage:
                self._serve(rnd, c)
        mine = [c for c in checks if c.stage == self.stage and self.replica in c.checkers]
        if mine:
            # off the event loop (a large stage takes a while to copy), before the update is applied
            model = await asyncio.to_thread(self.runner.frozen_copy)
            self._spawn(self._check_all(rnd, mine, model))
        return mine

    # ---- evidence ------------------------------------------------------------------------------------

    def _evidence_tag(self, rnd: Round, index: int, micro: int) -> Tag:
        # tagged with the next step, so the checker's mailbox keeps it after step ``rnd`` is forgotten
        return make_tag(Round(rnd.epoch, rnd.step + 1), Stream.SPOT_EVIDENCE, index=index, chunk=micro)

    def _serve(self, rnd: Round, c: Check) -> None:
        suspect = self.plan.stages[c.stage].peers[c.suspect]
        acts = (suspect, key_of(make_tag(rnd, Stream.ACTIVATIONS, chunk=c.micro)))
        grads = (suspect, key_of(make_tag(rnd, Stream.ACTIVATION_GRADS, chunk=c.micro)))
        if c.stage == self.stage + 1:  # the suspect's upstream: what it sent, what came back
            index, blobs = FROM_PREV, [self.ledger.sent.get(acts), self.ledger.received.get(grads)]
        else:  # its downstream: what it received, and the gradient it sent back
            index, blobs = FROM_NEXT, [self.ledger.received.get(acts), self.ledger.sent.get(grads)]
        if any(b is None for b in blobs):
            logger.info("no evidence of micro-batch %d of step %d to serve", c.micro, rnd.step)
            return
        message = pack_evidence([b for b in blobs if b is not None])
        for k in c.checkers:
            peer = self.plan.stages[c.stage].peers[k]
            self._spawn(self._send(peer, self._evidence_tag(rnd, index, c.micro), message))

    async def _fetch(self, rnd: Round, peer: str, index: int, micro: int) -> list[bytes]:
        try:
            data = await self.box.recv(peer, self._evidence_tag(rnd, index, micro), self.timeout_s)
            return unpack_evidence(data, 2)
        except (TimeoutError, ValueError, WireError, PeerError, OSError) as e:
            raise Inconclusive(f"evidence from {peer[-8:]}: {e}") from None

    def _open(
        self, author: str, receiver: str, tag: Tag, sealed: bytes, shape: tuple[int, ...], codec: Codec
    ) -> torch.Tensor:
        try:
            return codec.decode(check_seal(author, receiver, tag, sealed), expect=shape)
        except (SealError, CompressionError) as e:
            raise Inconclusive(f"evidence of {tag}: {e}") from None

    # ---- checks --------------------------------------------------------------------------------------

    async def _check_all(self, rnd: Round, checks: list[Check], model: StageModel) -> None:
        for c in checks:
            try:
                await self._check(rnd, c, model)
            except Inconclusive as e:
                logger.info("spot check of step %d micro-batch %d inconclusive: %s", rnd.step, c.micro, e)

    async def _check(self, rnd: Round, c: Check, model: StageModel) -> None:
        stages, j, i, m = self.plan.stages, c.stage, c.suspect, c.micro
        suspect = stages[j].peers[i]
        batches = self.batch(rnd.step, i)
        if m >= len(batches):  # that replica has fewer sequences this step: nothing to check
            return
        mb = batches[m]
        # the suspect's links, each direction with the chain the plan gave it (TrainPlan.link_codecs)
        links = link_codecs(self.plan, j, i, self.codec.spec)
        acts, grads = (
            make_tag(rnd, Stream.ACTIVATIONS, chunk=m),
            make_tag(rnd, Stream.ACTIVATION_GRADS, chunk=m),
        )
        y = g_out = x = g_in = None
        # the checker holds the suspect's stage, so its cuts' widths are the suspect's
        out_shape = (*mb.rows, self.runner.model.width_out)
        in_shape = (*mb.rows, self.runner.model.width_in)
        if j + 1 < len(stages):  # what the suspect sent on, and the gradient that came back to it
            nxt = stages[j + 1].peers[i]
            sent, back = await self._fetch(rnd, nxt, FROM_NEXT, m)
            y = self._open(suspect, nxt, acts, sent, out_shape, links.acts_out)
            g_out = self._open(nxt, suspect, grads, back, out_shape, links.grads_in)
        if j > 0:  # what the suspect was given, and the gradient it sent back
            prev = stages[j - 1].peers[i]
            given, back = await self._fetch(rnd, prev, FROM_PREV, m)
            x = self._open(prev, suspect, acts, given, in_shape, links.acts_in)
            g_in = self._open(suspect, prev, grads, back, in_shape, links.grads_out)
        inputs = mb.inputs if x is None else x
        if inputs is None:
            raise Inconclusive("no input to replay")
        tokens = None if x is None else mb.inputs  # a stage re-embedding the ids at a bottleneck gets them
        y2, g_in2 = await in_idle_time(
            self.runner.replay, model, inputs, mb.targets, mb.weight, g_out, tokens
        )
        problems = []
        tol = self.trust.spot_tolerance
        if y is not None and y2 is not None and (err := mismatch(y, y2, links.acts_out, tol)) is not None:
            problems.append(f"its activations are {err:.1%} off")
        err = mismatch(g_in, g_in2, links.grads_out, tol) if g_in is not None and g_in2 is not None else None
        if err is not None:
            problems.append(f"its input gradients are {err:.1%} off")
        self.audit.checked[suspect] += 1
        if problems:
            self.audit.failed[suspect] += 1
            logger.warning(
                "spot check: %s (stage %d, replica %d) at step %d micro-batch %d: %s",
                suspect,
                j,
                i,
                rnd.step,
                m,
                "; ".join(problems),
            )
