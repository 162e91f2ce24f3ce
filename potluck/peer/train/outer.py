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
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Sequence

import torch

from potluck.compression import get_codec
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Phase, Round
from potluck.peer.collectives.diloco import AllGather, AllReduce, DiLoCo, OuterCodec
from potluck.peer.collectives.gather import allgather, payload_bound
from potluck.peer.config import DiLoCoConfig
from potluck.peer.errors import ContributionError, OuterDecodeError
from potluck.peer.train.pipeline import Timing
from potluck.protocol.jobspec import CompressionSpec

logger = logging.getLogger(__name__)


def outer_codec(comp: CompressionSpec) -> OuterCodec | None:
    """The job's outer codec, or None (dense all-reduce); ``SpecError`` names a bad chain."""
    if comp.outer is None:
        return None
    return OuterCodec(comp.outer, comp.outer_ef_decay)


def outer_config(comp: CompressionSpec) -> DiLoCoConfig:
    """The DiLoCo settings of a job: H = ``sync_every``, the outer step's ``outer_lr`` and Nesterov
    ``outer_momentum``; no outer momentum under a decaying residual (the spec refuses setting both)."""
    cfg = DiLoCoConfig(
        inner_steps=comp.sync_every, outer_lr=comp.outer_lr, outer_momentum=comp.outer_momentum
    )
    if comp.outer is not None and comp.outer_ef_decay < 1.0:
        return dataclasses.replace(cfg, outer_momentum=0.0)
    return cfg


def make_diloco(params: Iterable[torch.nn.Parameter], comp: CompressionSpec) -> DiLoCo:
    """A fresh DiLoCo over ``params`` (its snapshot: their current values; an empty residual)."""
    return DiLoCo(params, outer_config(comp), outer_codec(comp))


def part_bounds(diloco: DiLoCo) -> list[int]:
    """The most bytes each part's payload may hold (refused beyond, before decoding)."""
    if diloco.outer_codec is None:
        return []
    codec = get_codec(diloco.outer_codec.spec)
    return [payload_bound(codec, n) for _o, n in diloco.parts]


def stage_gather(
    box: Mailbox,
    peers: Sequence[str],
    diloco: DiLoCo,
    rnd: Round,
    timeout_s: float,
    timing: Timing,
) -> AllGather | None:
    """The all-gather of step ``rnd``'s outer sync among the stage's replicas ``peers`` (None without an
    outer codec); its seconds count as the step's all-reduce time in ``timing``."""
    if diloco.outer_codec is None:
        return None
    bounds = part_bounds(diloco)
    round_no = rnd.at(Phase.OUTER).pack()

    async def gather(payloads: list[bytes]) -> list[list[bytes]]:
        t0 = time.perf_counter()
        try:
            return await allgather(box, peers, round_no, payloads, bounds, timeout_s)
        finally:
            timing.allreduce += time.perf_counter() - t0

    return gather


async def outer_step(
    diloco: DiLoCo, allreduce: AllReduce, gather: AllGather | None, peers: Sequence[str]
) -> bool:
    """Count an inner step and sync every H of them (``DiLoCo.after_inner_step``); a replica's payload
    that cannot be decoded fails the sync with a ``ContributionError`` naming that replica's peer."""
    try:
        return await diloco.after_inner_step(allreduce, gather)
    except OuterDecodeError as e:
        peer = peers[e.who] if 0 <= e.who < len(peers) else "?"
        raise ContributionError(peer, f"outer sync: the payload of {peer} is refused: {e}") from e
