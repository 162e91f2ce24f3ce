"""A job's coded DiLoCo outer sync (``compression.outer``, issue 22): the codec and the exchange.

Without ``compression.outer`` a stage's replicas all-reduce their dense pseudo-gradient every
``sync_every`` steps with the job's gradient codec (the tree all-reduce). With it, each replica codes
its pseudo-gradient plus its error-feedback residual with that chain (``DiLoCo`` with an ``OuterCodec``)
and sends the payloads to the stage's other replicas (``collectives/gather.py``); every replica decodes
all of them in the plan's replica order and applies the same outer step, so replicas stay bit-identical.

The residual (what the codec has not sent yet) is local state of each replica, never checkpointed: a
resume or a new plan starts with an empty one, so it drops at most what the codec held back (with
``outer_ef_decay`` d < 1, a geometric sum of per-sync residuals bounded by 1 / (1 - d) syncs' worth;
with d = 1, all that top-k has not sent). Checkpoints are only taken right after a sync, when replicas
agree, so a resume never mixes residuals of different replicas into the weights.

The outer step is SGD with ``compression.outer_lr`` and Nesterov ``compression.outer_momentum`` (0.7 and
0.9 by default), for a coded or an uncoded sync alike. With ``outer_ef_decay`` < 1 the decaying residual
plays the part of the outer momentum (SparseLoCo), so the outer step then runs without Nesterov momentum.

Untrusted swarms (``trust.aggregation = "trimmed_mean"``): after the all-gather the replicas compare
digests of what they gathered (``gather.echo``), then each takes the coordinate-wise trimmed mean of the
decoded contributions, summed in a fixed order so every machine gets the same bits. A replica that sends
inflated or garbage payloads to everyone is trimmed (or, undecodable, left out) on every replica alike;
one that sends different payloads to different replicas fails the sync.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from potluck.compression import get_codec
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Phase, Round
from potluck.peer.collectives.diloco import AllGather, AllReduce, DiLoCo, OuterCodec, Prepared
from potluck.peer.collectives.gather import allgather, echo, payload_bound
from potluck.peer.collectives.partial import allgather_by_deadline
from potluck.peer.collectives.robust import Audit
from potluck.peer.config import DiLoCoConfig
from potluck.peer.errors import ContributionError, OuterDecodeError, StragglerError
from potluck.peer.train.pipeline import Timing
from potluck.protocol.jobspec import CompressionSpec, TrustSpec

logger = logging.getLogger(__name__)


def outer_codec(comp: CompressionSpec, trust: TrustSpec | None = None) -> OuterCodec | None:
    """The job's outer codec, combining by its ``trust.aggregation`` (mean by default), or None (dense
    all-reduce); ``SpecError`` names a bad chain."""
    if comp.outer is None:
        return None
    rule, trim = (trust.aggregation, trust.trim) if trust is not None else ("mean", 0.2)
    return OuterCodec(comp.outer, comp.outer_ef_decay, rule=rule, trim=trim)


def outer_config(comp: CompressionSpec) -> DiLoCoConfig:
    """The DiLoCo settings of a job: H = ``sync_every``, the outer step's ``outer_lr`` and Nesterov
    ``outer_momentum``; no outer momentum under a decaying residual (the spec refuses setting both)."""
    return DiLoCoConfig(
        inner_steps=comp.sync_every, outer_lr=comp.outer_lr, outer_momentum=comp.outer_momentum_used
    )


def make_diloco(
    params: Iterable[torch.nn.Parameter], comp: CompressionSpec, trust: TrustSpec | None = None, step: int = 0
) -> DiLoCo:
    """A fresh DiLoCo over ``params`` after ``step`` steps (its snapshot: their current values; an empty
    residual). Its syncs fall on the steps that are multiples of H whatever step it starts from, as
    every plan's do: pauses, hand-offs and checkpoints are placed at those steps (``job/lease.py``,
    ``job/handoff.py``), so a plan that starts between two syncs must sync at the next one too."""
    diloco = DiLoCo(params, outer_config(comp), outer_codec(comp, trust))
    diloco.inner_done = step % comp.sync_every
    return diloco


def synced_weights(diloco: DiLoCo, model: torch.nn.Module, previous: bool = False) -> dict[str, torch.Tensor]:
    """The weights of ``model`` at the last outer sync (DiLoCo's snapshot; ``previous``: at the sync
    before it), keyed as ``StageRunner.state_tensors`` keys them ("model.<name>", on the host, copied):
    every replica of the stage agrees on these, unlike the weights between syncs. A weight tied under
    two names gets its snapshot under both; one DiLoCo does not train (frozen) is the model's own."""
    kept = diloco.previous if previous else diloco.snapshot
    assert kept is not None
    at_sync = {id(p): s for p, s in zip(diloco.params, kept, strict=True)}
    out = {}
    for name, v in model.state_dict(keep_vars=True).items():
        if id(v) in at_sync:
            out[f"model.{name}"] = at_sync[id(v)].detach().cpu().clone()
    return out


def part_bounds(diloco: DiLoCo) -> list[int]:
    """The most bytes each part's payload may hold (refused beyond, before decoding)."""
    if diloco.outer_codec is None:
        return []
    codec = get_codec(diloco.outer_codec.spec)
    return [payload_bound(codec, n) for _o, n in diloco.parts]


@dataclass
class Lateness:
    """A replica's record under the deadline policy (``collectives/partial.py``): syncs it was left out
    of, in all and in a row; ``StragglerError`` after ``max_misses`` in a row, as ``straggle.py``."""

    max_misses: int
    missed: int = 0
    in_a_row: int = 0

    def note(self, left_out: bool) -> None:
        self.missed += left_out
        self.in_a_row = self.in_a_row + 1 if left_out else 0
        if left_out:
            logger.info("left out of the outer sync (%d in a row): what it sent waits", self.in_a_row)
        if self.in_a_row >= self.max_misses:
            raise StragglerError(f"left out of {self.in_a_row} outer syncs in a row (sync.max_misses)")


def stage_gather(
    box: Mailbox,
    peers: Sequence[str],
    diloco: DiLoCo,
    rnd: Round,
    timeout_s: float,
    timing: Timing,
    deadline_s: float | None = None,
    lateness: Lateness | None = None,
) -> AllGather | None:
    """The all-gather of step ``rnd``'s outer sync among the stage's replicas ``peers`` (None without an
    outer codec); its seconds count as the step's all-reduce time in ``timing``. With ``deadline_s``
    (the job's ``sync.policy = "deadline"``) the stage's leader takes in only the payloads that came
    within it; a replica left out keeps its own in its residual and counts it in ``lateness``."""
    if diloco.outer_codec is None:
        return None
    bounds = part_bounds(diloco)
    round_no = rnd.at(Phase.OUTER).pack()
    robust = diloco.outer_codec.rule != "mean"

    async def exchange(payloads: list[bytes]) -> tuple[list[str], list[list[bytes]]]:
        if deadline_s is None:
            return list(peers), await allgather(box, peers, round_no, payloads, bounds, timeout_s)
        members, got = await allgather_by_deadline(
            box, peers, round_no, payloads, bounds, timeout_s, deadline_s
        )
        left_out = peers.index(box.peer_id) not in members
        if left_out:
            diloco.left_out()  # what it sent goes back into its residual: sent at the next sync
        if lateness is not None:
            lateness.note(left_out)
        return [peers[i] for i in members], got

    async def gather(payloads: list[bytes]) -> list[list[bytes]]:
        t0 = time.perf_counter()
        try:
            senders, got = await exchange(payloads)
            if robust:  # a robust rule weighs the payloads: every replica must hold the same ones
                left = max(1.0, timeout_s - (time.perf_counter() - t0))
                await echo(box, peers, round_no, got, left, senders)
            return got
        finally:
            timing.allreduce += time.perf_counter() - t0

    return gather


async def outer_mean(
    diloco: DiLoCo,
    mine: Prepared,
    allreduce: AllReduce,
    gather: AllGather | None,
    peers: Sequence[str],
    audit: Audit | None = None,
) -> torch.Tensor:
    """The stage's mean pseudo-gradient from this replica's ``mine`` (``DiLoCo.prepare``); a replica's
    payload that cannot be decoded fails the sync with a ``ContributionError`` naming that replica's peer
    (under the mean; a robust rule leaves it out). ``audit`` counts, per peer, the contributions seen,
    refused and trimmed away by a robust rule, which the trainer reports as its witness of the others."""
    try:
        mean = await diloco.exchange(mine, allreduce, gather)
    except OuterDecodeError as e:
        peer = peers[e.who] if 0 <= e.who < len(peers) else "?"
        raise ContributionError(peer, f"outer sync: the payload of {peer} is refused: {e}") from e
    if audit is not None and diloco.outer_codec is not None and diloco.outer_codec.rule != "mean":
        for who, peer in enumerate(peers):
            audit.seen[peer] += 1
            audit.refused[peer] += who in diloco.refused
            audit.clipped[peer] += who in diloco.outliers
        if diloco.refused or diloco.outliers:
            named = [peers[w] for w in sorted({*diloco.refused, *diloco.outliers}) if w < len(peers)]
            logger.warning("outer sync: left out or trimmed the contributions of %s", ", ".join(named))
    return mean


async def outer_step(
    diloco: DiLoCo,
    allreduce: AllReduce,
    gather: AllGather | None,
    peers: Sequence[str],
    audit: Audit | None = None,
    force: bool = False,
) -> bool:
    """Count an inner step and sync every H of them, or now when ``force``, waiting for the exchange
    (``outer_mean``); returns whether it synced."""
    if not diloco.count(force):
        return False
    diloco.apply_outer(await outer_mean(diloco, diloco.prepare(), allreduce, gather, peers, audit))
    return True
