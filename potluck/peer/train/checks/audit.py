"""Audits of shard owners: other replicas redo a random chunk's aggregation and compare.

Under a robust rule each replica owns a shard of its stage's gradient on a one-hop tree: it receives
every other replica's slice unsummed, applies the rule and broadcasts the result. A hostile owner could
broadcast anything finite for its shard, 1/n of the gradient's coordinates. So every contribution on
those trees is sealed (``peer/seal``), the owner keeps its own row and every replica the result it
got. Once step s is committed, every peer draws the same audits from the step's decision
(``evidence.check_seed``): each chunk of each owner with
probability ``trust.spot_checks``, by two other replicas.

The owner pushes its evidence to the auditors: its own row and every row it received, each sealed by
its author. It cannot alter another replica's row (it holds no other key), and each auditor sent it one
row itself. The auditors run the owner's rule over the rows (``robust.combine``: the same bits from the
same rows) and compare with the result the owner broadcast to them, within the codec's error. A mismatch
is a failed check, testimony like a failed spot check (``Witness.failed``); an owner whose evidence does
not come counts as withholding it at that step (``Witness.withheld``). Conviction takes most of the
stage's other replicas, and at least two, each having caught it (``coordinator/job/accuse.py``).

What stays open: the owner's own row is its word, so it can bias its shard as far as one contributor
can under the rule, no further; and a ban landing between the owner's and an auditor's reads of the ban
list can make one audit fail (the owner excluded a peer the auditor does not know as banned yet).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from potluck.compression import get_codec
from potluck.compression.errors import CompressionError
from potluck.net.mailbox import Mailbox
from potluck.net.tags import INDEX_BITS, Direction, Round, Stream, Tag, make_tag
from potluck.peer.collectives.robust import Audit, combine
from potluck.peer.collectives.tree import OWN_ROW_CODEC
from potluck.peer.config import AllReduceConfig
from potluck.peer.errors import PeerError, SealError
from potluck.peer.seal import Key, Ledger, check_seal
from potluck.peer.train.checks import evidence
from potluck.peer.train.commit import Decision
from potluck.protocol.collective import AllReduceSchedule
from potluck.protocol.errors import WireError
from potluck.protocol.jobspec import TrustSpec

logger = logging.getLogger(__name__)

AGGREGATION_TOLERANCE = 1e-3  # relative L2 beyond the codec's error: the rule is exact, this is slack


@dataclass(frozen=True)
class ShardCheck:
    key: Key  # the audited chunk's contributions: (round, stream, chunk, REDUCE)
    root: str  # its owner
    auditors: tuple[str, ...]


def tree_index(key: Key) -> int:
    """The tree a one-hop chunk's messages travel on (the index bits of their stream)."""
    return key[1] & ((1 << INDEX_BITS) - 1)


def select_audits(
    seed: bytes, keys: set[Key], schedule: AllReduceSchedule, fraction: float
) -> list[ShardCheck]:
    """The step's audits over the one-hop chunks ``keys``: each with probability ``fraction``, by up to
    ``MAX_CHECKERS`` replicas other than its owner. Pure: every replica of the stage draws the same."""
    if fraction <= 0 or len(schedule.peers) < 3:
        return []
    out = []
    for key in sorted(keys):
        if evidence.uniform(seed, *key) >= fraction:
            continue
        tree = schedule.trees[tree_index(key)]
        others = [p for p in schedule.peers if p != tree.root]
        others.sort(key=lambda p: evidence.uniform(seed, *key, int.from_bytes(p.encode()[-8:], "little")))
        out.append(ShardCheck(key, tree.root, tuple(others[: evidence.MAX_CHECKERS])))
    return out


class ShardAudits(evidence.Duty):
    """One replica's part in auditing its stage's shard owners: evidence it owes, audits it makes."""

    def __init__(
        self,
        box: Mailbox,
        schedule: AllReduceSchedule,
        ledger: Ledger,
        cfg: AllReduceConfig,
        trust: TrustSpec,
        audit: Audit,
        timeout_s: float,
        label: str,
    ) -> None:
        """``label``: names the stage (job and stage index), so that stages draw different audits."""
        super().__init__(box)
        self.schedule, self.ledger, self.cfg, self.label = schedule, ledger, cfg, label
        self.trust, self.audit, self.timeout_s = trust, audit, timeout_s
        self.me = box.peer_id
        self.codec = get_codec(cfg.codec)
        self._withheld_at: dict[str, int] = {}  # owner -> the last step whose evidence it withheld

    def after_commit(self, rnd: Round, decision: Decision) -> list[ShardCheck]:
        """Step ``rnd`` is committed: push the evidence of this peer's audited shards, start its audits."""
        first, stop = Round(rnd.epoch, rnd.step).pack(), Round(rnd.epoch, rnd.step + 1).pack()
        keys = {
            key
            for book in (self.ledger.sent, self.ledger.received)
            for _, key in book
            if first <= key[0] < stop and key[1] >> INDEX_BITS == Stream.TREE and key[3] == Direction.REDUCE
        }
        seed = evidence.check_seed(f"{self.label}/audit", rnd, decision)
        checks = select_audits(seed, keys, self.schedule, self.trust.spot_checks)
        for c in checks:
            if c.root == self.me:
                self._serve(rnd, c)
        mine = [c for c in checks if self.me in c.auditors]
        for c in mine:  # what the owner broadcast here, read now: the ledger forgets the step next
            down = (c.key[0], c.key[1], c.key[2], Direction.BROADCAST)
            got = self.ledger.received.get((c.root, down))
            if got is None:
                logger.info("audit of %s skipped: no broadcast of it here", c.key)
                continue
            self._spawn(self._check(rnd, c, got))
        return mine

    def _evidence_tag(self, rnd: Round, key: Key) -> Tag:
        # tagged with the next step (same phase), so the auditor keeps it after step ``rnd`` is forgotten
        phase = Round.unpack(key[0]).phase
        index = tree_index(key)
        return make_tag(
            Round(rnd.epoch, rnd.step + 1, phase), Stream.AUDIT_EVIDENCE, index=index, chunk=key[2]
        )

    def _serve(self, rnd: Round, c: ShardCheck) -> None:
        """As the owner: its own row and every row it received, as their authors sealed them."""
        tree = self.schedule.trees[tree_index(c.key)]
        children = tree.children(self.me, self.schedule.peers)
        pieces = [self.ledger.sent.get((self.me, c.key))]
        pieces += [self.ledger.received.get((child, c.key)) for child in children]
        if any(p is None for p in pieces):
            logger.info("no evidence of %s to serve", c.key)
            return
        message = evidence.pack_evidence([p for p in pieces if p is not None])
        for auditor in c.auditors:
            self._spawn(self._send(auditor, self._evidence_tag(rnd, c.key), message))

    async def _check(self, rnd: Round, c: ShardCheck, got: bytes) -> None:
        tree = self.schedule.trees[tree_index(c.key)]
        children = tree.children(c.root, self.schedule.peers)
        up = Tag(c.key[0], c.key[1], c.key[2], Direction.REDUCE)
        broadcast = self.codec.decode(got)  # decoded once already, strictly, by the all-reduce
        try:
            data = await self.box.recv(c.root, self._evidence_tag(rnd, c.key), self.timeout_s)
        except (TimeoutError, WireError, PeerError, OSError) as e:
            # counted once per step (its audits wait alike, so they end in step order): a crash
            # withholds one step's evidence, no more
            if self._withheld_at.get(c.root) != rnd.step:
                self._withheld_at[c.root] = rnd.step
                self.audit.withheld[c.root] += 1
            logger.warning(
                "audit: %s withheld the evidence of its aggregation at step %d: %s", c.root, rnd.step, e
            )
            return
        problem = self._verdict(c.root, children, up, data, broadcast)
        self.audit.checked[c.root] += 1
        if problem is not None:
            self.audit.failed[c.root] += 1
            logger.warning(
                "audit: %s's aggregate at step %d (%s) is wrong: %s", c.root, rnd.step, up, problem
            )

    def _verdict(
        self, root: str, children: list[str], up: Tag, data: bytes, broadcast: torch.Tensor
    ) -> str | None:
        """None if the owner's broadcast is its rule over the rows it shows; else what is wrong."""
        try:
            pieces = evidence.unpack_evidence(data, 1 + len(children))
            own = get_codec(OWN_ROW_CODEC).decode(
                check_seal(root, root, up, pieces[0]), expect=broadcast.shape
            )
            rows = [own] + [
                self.codec.decode(check_seal(child, root, up, piece), expect=broadcast.shape)
                for child, piece in zip(children, pieces[1:], strict=True)
            ]
        except (ValueError, SealError, CompressionError) as e:
            return f"its evidence does not hold up ({e})"
        who = [root, *children]
        stack = torch.stack(rows)
        for excluded in (self.audit.excluded & set(who), set()):
            try:
                result = combine(stack, who, self.cfg.rule, self.cfg.trim, self.cfg.average, excluded).result
            except ValueError:
                continue
            if evidence.mismatch(broadcast, result, self.codec, AGGREGATION_TOLERANCE) is None:
                return None
        return "its broadcast is not its rule over the rows it received"
