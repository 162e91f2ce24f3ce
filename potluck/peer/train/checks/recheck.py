"""Gradient checks: a replica recomputes the step of a peer whose contribution its rule found outlying.

Under a robust rule every replica owns a shard of the stage's gradient and sees each other replica's
slice of it unsummed (``collectives/tree.py``), sealed by its sender and kept in the ledger until the
step is committed. Clipping a contribution is only a suspicion: a peer with unusual data or a bad
numerical step is clipped now and then, honestly. So an owner that clipped or refused peer X's slice at
step s, and most of X's slices so far, confirms it by recomputation: it copies its weights before
applying step s (replicas hold the same weights), recomputes X's gradient of that step from X's own
micro-batches (the data each replica reads is fixed by the plan and the step), and compares the
coordinates of its shard with what X sent, allowing the gradient codec's error (twice, and once more for
what error feedback carried from the step before) plus ``trust.spot_tolerance`` (relative L2). A mismatch
is a failed check in this peer's ``Audit``, published as testimony (``Witness.failed``): the coordinator
convicts when most of the stage's other replicas, and at least two, recomputed X otherwise
(``coordinator/job/accuse.py``). Besides, each step every replica checks one other, drawn from the
committed decision, with probability ``trust.spot_checks``, which reaches attacks that hide inside the
variance and are never clipped.

Cost: one step's compute per check, in the background at the lowest CPU priority (``idle.py``). An
honest owner checks a peer at most once every ``RECHECK_STEPS`` steps and runs one check at a time, so a
hostile peer can cost each replica at most that
(it is convicted after its first failed checks); a hostile owner's false testimony needs a majority.
The evidence is the checker's own: the slices X sent it, under X's seal, and data every replica has.
Only stages holding the whole model (a single-stage plan): a pipeline stage's inputs and output gradients
come from its neighbours, and there outlying testimony convicts alone (docs/security.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from potluck.compression import get_codec
from potluck.compression.errors import CompressionError
from potluck.model.stage import StageRunner
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Direction, Round, Stream, make_tag
from potluck.peer.collectives.robust import Audit
from potluck.peer.collectives.tree import tree_chunks
from potluck.peer.config import AllReduceConfig
from potluck.peer.seal import Ledger
from potluck.peer.train.checks import evidence
from potluck.peer.train.checks.idle import in_idle_time
from potluck.peer.train.commit import Decision
from potluck.peer.train.pipeline import MicroBatch
from potluck.protocol.collective import AllReduceSchedule
from potluck.protocol.jobspec import TrustSpec

logger = logging.getLogger(__name__)

RECHECK_STEPS = 10  # steps before the same peer is recomputed again by the same replica
# A peer's step is recomputed when the rule refused or clipped its slice in that step and most of its
# slices so far (at least FLAG_MIN_SEEN seen): "clipped repeatedly", as the accusation rule counts. An
# honest slice strays beyond the clipping radius now and then (the benchmark's clean runs flagged some
# peer at nearly every step when one stray slice sufficed: a check per replica and step, +25-40% step
# time); an attack moves all of them.
FLAG_SHARE = 0.5
FLAG_MIN_SEEN = 8


@dataclass(frozen=True)
class Sent:
    """What a suspect sent this replica at one step: its slices of this replica's shard, in order."""

    step: int
    rows: list[bytes]
    where: list[tuple[int, int, int]]  # (bucket, tree, chunk) of each row


class GradientChecks(evidence.Duty):
    """One replica's part in confirming its rule's suspicions by recomputing the suspects' steps."""

    def __init__(
        self,
        runner: StageRunner,
        box: Mailbox,
        peers: list[str],
        schedule: AllReduceSchedule,
        buckets: list[list[int]],
        ledger: Ledger,
        cfg: AllReduceConfig,
        trust: TrustSpec,
        audit: Audit,
        batch: Callable[[int, int], list[MicroBatch]],
        feedback: bool,
        label: str,
    ) -> None:
        """``peers``: the stage's replicas in replica order; ``buckets``: the parameter indices of each
        gradient bucket (``BucketSync.buckets``); ``batch(step, replica)``: that replica's micro-batches
        of a step; ``label`` names the stage."""
        super().__init__(box)
        self.peers = list(peers)
        self.runner, self.schedule, self.buckets, self.ledger = runner, schedule, buckets, ledger
        self.cfg, self.trust, self.audit, self.batch = cfg, trust, audit, batch
        self.feedback, self.label = feedback, label
        self.me = ledger.peer_id
        self.codec = get_codec(cfg.codec)
        self._last: dict[str, int] = {}  # suspect -> the step this replica last recomputed
        self._outlying: dict[str, int] = {}  # peer -> its refused + clipped count before the step
        self.done = 0  # checks made (each also counts in ``audit.checked``, beside audits and spot checks)
        self.failed = 0

    def before_step(self) -> None:
        """Remember what the rule has found so far: the step's suspects are the peers it adds to."""
        self._outlying = dict(self.audit.refused + self.audit.clipped)

    def suspects(self, rnd: Round, decision: Decision) -> list[str]:
        """The peers this replica checks after step ``rnd``: those whose slice its rule refused or
        clipped in this step, else (with probability ``trust.spot_checks``) one drawn at random; never
        one it caught already, a banned one, or one checked within ``RECHECK_STEPS`` steps, and none
        while a check runs."""
        if self.tasks:
            return []

        def due(p: str) -> bool:
            recent = rnd.step - self._last.get(p, -RECHECK_STEPS) < RECHECK_STEPS
            banned = p in self.audit.excluded  # its rows are left out already
            return p != self.me and not banned and not self.audit.failed[p] and not recent

        def outlying(p: str) -> bool:  # clipped this step, and repeatedly: most of its slices so far
            bad, seen = self.audit.refused[p] + self.audit.clipped[p], self.audit.seen[p]
            now = bad > self._outlying.get(p, 0)
            return now and seen >= FLAG_MIN_SEEN and bad >= FLAG_SHARE * seen

        flagged = sorted(
            p for p in set(self.audit.refused) | set(self.audit.clipped) if outlying(p) and due(p)
        )
        if flagged:
            return flagged[:1]
        seed = evidence.check_seed(f"{self.label}/recheck", rnd, decision)
        draw = evidence.uniform(seed, int.from_bytes(self.me.encode()[-8:], "little"))
        others = [p for p in self.peers if due(p)]
        if not others or draw >= self.trust.spot_checks:
            return []
        return [others[int(draw / self.trust.spot_checks * len(others)) % len(others)]]

    async def after_commit(self, rnd: Round, decision: Decision) -> list[str]:
        """Step ``rnd`` is committed and not yet applied: take the suspects' slices from the ledger (it
        forgets the step next) and a copy of the weights, and recompute in the background."""
        out = []
        for suspect in self.suspects(rnd, decision):
            sent = self._sent(rnd, suspect)
            if sent is None:
                continue
            self._last[suspect] = rnd.step
            model = await asyncio.to_thread(self.runner.frozen_copy)
            self._spawn(self._check(suspect, sent, model))
            out.append(suspect)
        return out

    def _sent(self, rnd: Round, suspect: str) -> Sent | None:
        """The suspect's sealed slices of this replica's shard at step ``rnd`` (sealed before the READY)."""
        rows, where = [], []
        for b in range(len(self.buckets)):
            round_no = Round(rnd.epoch, rnd.step).bucket(b).pack()
            for t, tree in enumerate(self.schedule.trees):
                if tree.root != self.me:
                    continue
                c = 0
                while True:
                    tag = make_tag(round_no, Stream.TREE, index=t, chunk=c, direction=Direction.REDUCE)
                    row = self.ledger.payload(suspect, tag)
                    if row is None:
                        break
                    rows.append(row)
                    where.append((b, t, c))
                    c += 1
        if not rows:
            logger.info("gradient check of %s at step %d skipped: nothing it sent here", suspect, rnd.step)
            return None
        return Sent(rnd.step, rows, where)

    async def _check(self, suspect: str, sent: Sent, model: torch.nn.Module) -> None:
        replica = self.peers.index(suspect)
        batches = [(mb.inputs, mb.targets, mb.weight) for mb in self.batch(sent.step, replica)]
        if any(x is None or y is None for x, y, _ in batches):
            return
        grads = await in_idle_time(self.runner.recompute_gradients, model, batches)
        problem = self._verdict(sent, grads)
        self.audit.checked[suspect] += 1
        self.done += 1
        if problem is not None:
            self.audit.failed[suspect] += 1
            self.failed += 1
            logger.warning("gradient check: %s's contribution to step %d %s", suspect, sent.step, problem)
        else:
            logger.info("gradient check: %s's contribution to step %d holds up", suspect, sent.step)

    def _verdict(self, sent: Sent, grads: list[torch.Tensor]) -> str | None:
        """None if what the suspect sent is its gradient, within the codec's error; else what is wrong."""
        got, want = [], []
        cut: dict[int, list[list[torch.Tensor]]] = {}
        for payload, (b, t, c) in zip(sent.rows, sent.where, strict=True):
            if b not in cut:
                flat = torch.cat([grads[i].reshape(-1).float() for i in self.buckets[b]])
                cut[b] = tree_chunks(flat, self.schedule, self.cfg)
            if c >= len(cut[b][t]):
                return f"holds chunk {c} of tree {t}, which bucket {b} does not have"
            mine = cut[b][t][c]
            try:
                got.append(self.codec.decode(payload, expect=tuple(mine.shape)))
            except CompressionError as e:
                return f"does not decode ({e})"
            want.append(mine)
        sent_flat, recomputed = torch.cat(got), torch.cat(want)
        if not bool(torch.isfinite(sent_flat).all()):
            return "holds NaN or Inf"
        # the bucket and the tree each code it once, and error feedback carries one step's coding error
        codings = 3 if self.feedback else 2
        err = evidence.mismatch(sent_flat, recomputed, self.codec, self.trust.spot_tolerance, codings)
        return None if err is None else f"is {err:.1%} off its recomputation"
