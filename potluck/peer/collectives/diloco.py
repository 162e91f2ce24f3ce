"""DiLoCo-style local steps: H inner optimizer steps, then one outer step on the averaged pseudo-gradient.

Effect on the update: replicas drift apart for H inner steps; at each sync they all-reduce the
pseudo-gradient (snapshot - current parameters: how far each moved since the last sync), reset to the
snapshot, and apply one outer Nesterov-momentum SGD step with that mean. With H = 1, outer lr 1 and no
momentum this is plain synchronous data parallelism on the inner optimizer's updates. Communication
drops H-fold, and the pseudo-gradient (not raw gradients) is what gets compressed, which the research
notes found to be where aggressive codecs hurt least.

The all-reduce is injected (``allreduce(flat_tensor) -> mean``), so this runs on the tree executor, a
relaxed round, or an in-process reference with the same code.

Sparse outer sync (``OuterCodec``, issue 22): each replica adds its pseudo-gradient to a decaying
error-feedback buffer, sends only a coded top-k of that buffer (e.g. ``topk:density=0.03,method=chunk|
int2|zstd``) and keeps the rest for later syncs. The sparse payloads of different replicas do not sum
into a sparse payload, so they are exchanged whole: an injected ``allgather(own payloads) -> every
contributor's payloads`` (each replica uploads one payload per part), and every replica decodes and
averages the same bytes in the same order, so all replicas apply bit-identical outer steps. With a
decay below 1 the buffer plays the part of the outer momentum: run it with ``outer_momentum = 0``.
Without an all-gather the locally decoded sparse pseudo-gradient goes through ``allreduce`` (same
update, but the bytes are then those of the all-reduce's own codec).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from potluck.compression import Codec, DecodeError, ErrorFeedback, all_finite, get_codec
from potluck.peer.collectives.robust import ordered_trimmed_mean
from potluck.peer.config import DiLoCoConfig
from potluck.peer.errors import OuterDecodeError

logger = logging.getLogger(__name__)

AllReduce = Callable[[torch.Tensor], Awaitable[torch.Tensor]]
AllGather = Callable[[list[bytes]], Awaitable[Sequence[Sequence[bytes]]]]


@dataclass(frozen=True)
class OuterCodec:
    """How a replica codes its pseudo-gradient before the exchange (SparseLoCo-style)."""

    spec: str  # any potluck.compression chain, e.g. "topk:density=0.03,method=chunk|int2|zstd"
    ef_decay: float = 1.0  # residual kept per sync; < 1 makes the residual the outer momentum
    part_elements: int = 1 << 20  # one payload per this many elements (keys name (sync, part))
    # How the decoded contributions combine: "mean", or "trimmed_mean" (per coordinate, drop the
    # ``trim`` fraction of largest and of smallest values; the job's trust.aggregation and trim)
    rule: str = "mean"
    trim: float = 0.2

    def __post_init__(self) -> None:
        get_codec(self.spec)  # raises SpecError on a bad chain
        if self.rule not in ("mean", "trimmed_mean"):
            raise ValueError(f"an outer sync combines by 'mean' or 'trimmed_mean', not {self.rule!r}")
        if not 0.0 <= self.ef_decay <= 1.0:
            raise ValueError(f"ef_decay must be in [0, 1], not {self.ef_decay}")
        if self.part_elements < 1:
            raise ValueError(f"part_elements must be positive, not {self.part_elements}")


@dataclass(frozen=True)
class Prepared:
    """One replica's side of a sync, taken when it is due: ``pseudo`` (snapshot - parameters then,
    flat, host fp32; read only: the all-reduce sums a copy) and, with an outer codec, the coded
    ``payloads`` that go on the wire instead."""

    pseudo: torch.Tensor
    payloads: list[bytes] | None


class DiLoCo:
    """Wraps a model's parameters; call ``after_inner_step`` after every inner optimizer step."""

    def __init__(
        self, params: Iterable[torch.nn.Parameter], cfg: DiLoCoConfig, outer_codec: OuterCodec | None = None
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.cfg = cfg
        self.snapshot = [p.detach().clone() for p in self.params]  # parameters at the last sync
        self.previous: list[torch.Tensor] | None = None  # at the sync before it, on the host (apply_outer)
        self.outer = torch.optim.SGD(
            self.snapshot, lr=cfg.outer_lr, momentum=cfg.outer_momentum, nesterov=cfg.outer_momentum > 0
        )
        self.inner_done = 0
        self.syncs = 0
        self.outer_codec = outer_codec
        self.codec: Codec | None = get_codec(outer_codec.spec) if outer_codec is not None else None
        self.numel = sum(s.numel() for s in self.snapshot)
        part = outer_codec.part_elements if outer_codec is not None else max(1, self.numel)
        self.parts = [(o, min(part, self.numel - o)) for o in range(0, self.numel, part)]
        decay = outer_codec.ef_decay if outer_codec is not None else 1.0
        self.feedback = [ErrorFeedback(decay=decay) for _ in self.parts]
        self.last_sent: list[bytes] = []  # this replica's payloads of the current sync
        # the last robust decode: contributors refused (undecodable, NaN/Inf) and trimmed away
        self.refused: list[int] = []
        self.outliers: list[int] = []

    async def after_inner_step(
        self, allreduce: AllReduce, allgather: AllGather | None = None, force: bool = False
    ) -> bool:
        """Count an inner step; every ``inner_steps`` of them, or when ``force`` (the job's last step,
        which every replica reaches together), sync. Returns whether it synced."""
        if not self.count(force):
            return False
        await self.sync(allreduce, allgather)
        return True

    def count(self, force: bool = False) -> bool:
        """Count an inner step; whether a sync is due after it (every ``inner_steps``, or ``force``)."""
        self.inner_done += 1
        return force or self.inner_done % self.cfg.inner_steps == 0

    def pseudo_gradient(self) -> torch.Tensor:
        """snapshot - current parameters, flat, on the host (the exchange codes host tensors)."""
        with torch.no_grad():
            return torch.cat(
                [(s - p.detach()).reshape(-1) for s, p in zip(self.snapshot, self.params, strict=True)]
            ).cpu()

    async def sync(self, allreduce: AllReduce, allgather: AllGather | None = None) -> None:
        self.apply_outer(await self.exchange(self.prepare(), allreduce, allgather))

    def prepare(self) -> Prepared:
        """What this replica contributes to a sync, taken now: its pseudo-gradient (kept whole, for an
        outer step applied after more inner steps, ``apply_outer(carry=...)``) and, with an outer
        codec, its payloads (the residual updated as they are coded)."""
        pseudo = self.pseudo_gradient()
        return Prepared(pseudo, self.encode_outer(pseudo) if self.codec is not None else None)

    async def exchange(
        self, mine: Prepared, allreduce: AllReduce, allgather: AllGather | None = None
    ) -> torch.Tensor:
        """The mean pseudo-gradient of the stage's replicas, from this replica's ``mine``."""
        if mine.payloads is None:
            return await allreduce(mine.pseudo)
        if allgather is not None:
            return self.decode_outer(await allgather(mine.payloads))
        return await allreduce(self.decode_outer([mine.payloads]))

    def encode_outer(self, flat: torch.Tensor | None = None) -> list[bytes]:
        """This replica's payloads for the sync: the pseudo-gradient (``flat``, else taken now) plus the
        decayed residual, coded per part; what the codec dropped stays in the residual for the next
        sync. ``flat`` is read, never written."""
        if self.codec is None:
            raise ValueError("encode_outer needs an OuterCodec")
        flat = self.pseudo_gradient() if flat is None else flat
        self.last_sent = [
            self.codec.encode(flat[o : o + n], key=(self.syncs, i), state=ef)
            for i, ((o, n), ef) in enumerate(zip(self.parts, self.feedback, strict=True))
        ]
        return list(self.last_sent)

    def decode_outer(self, contributions: Sequence[Sequence[bytes]]) -> torch.Tensor:
        """The mean of the contributors' decoded pseudo-gradients (in the given order, so every replica
        sums alike). Payloads are checked against this job's codec and part sizes before decoding;
        anything else raises ``OuterDecodeError`` (a ``DecodeError``) naming the contributor's place."""
        if self.codec is None:
            raise ValueError("decode_outer needs an OuterCodec")
        if not contributions:
            raise DecodeError("no contribution to the outer step")
        assert self.outer_codec is not None
        if self.outer_codec.rule != "mean":
            return self._decode_robust(contributions)
        acc = torch.zeros(self.numel, dtype=torch.float32)
        for who, payloads in enumerate(contributions):
            if len(payloads) != len(self.parts):
                raise OuterDecodeError(
                    who,
                    f"contribution {who} has {len(payloads)} payloads; the pseudo-gradient has "
                    f"{len(self.parts)} parts",
                )
            for (o, n), data in zip(self.parts, payloads, strict=True):
                try:
                    self.codec.decode_into(data, acc[o : o + n], accumulate=True)
                except DecodeError as exc:
                    raise OuterDecodeError(who, f"contribution {who}, part at {o}: {exc}") from exc
            if not all_finite(acc):  # a forged payload's NaN or Inf scale would poison every replica
                raise OuterDecodeError(who, f"contribution {who} decodes to NaN or Inf")
        return acc.div_(len(contributions))

    def _decode_robust(self, contributions: Sequence[Sequence[bytes]]) -> torch.Tensor:
        """The trimmed mean of the contributions, part by part. Only after an ``echo`` (gather.py) has
        shown every replica holds the same payloads: then a payload that does not decode, or decodes to
        NaN or Inf, is left out of its part on every replica alike (``refused``) instead of failing the
        sync, and the rule trims what is left."""
        assert self.codec is not None and self.outer_codec is not None
        k, acc = len(contributions), torch.empty(self.numel, dtype=torch.float32)
        refused = {who for who, payloads in enumerate(contributions) if len(payloads) != len(self.parts)}
        outliers: set[int] = set()
        for i, (o, n) in enumerate(self.parts):
            rows, ok = torch.zeros((k, n), dtype=torch.float32), []
            for who, payloads in enumerate(contributions):
                if who in refused:
                    continue
                try:
                    self.codec.decode_into(payloads[i], rows[who], accumulate=False)
                except DecodeError as exc:
                    logger.warning("outer sync: contribution %d, part at %d refused: %s", who, o, exc)
                    refused.add(who)
                    continue
                if not all_finite(rows[who]):
                    refused.add(who)
                    continue
                ok.append(who)
            if not ok:
                raise OuterDecodeError(min(refused), f"no contribution to part at {o} decodes")
            mean, trimmed = ordered_trimmed_mean(rows[ok], self.outer_codec.trim)
            acc[o : o + n] = mean
            outliers |= {ok[j] for j, out in enumerate(trimmed.tolist()) if out}
        self.refused, self.outliers = sorted(refused), sorted(outliers - refused)
        return acc

    def left_out(self) -> None:
        """This replica's payloads did not make it into the outer step (a relaxed round dropped them):
        put what they carried back into the residuals, so nothing is lost, only delayed."""
        if self.codec is None:
            return
        for (_o, n), ef, data in zip(self.parts, self.feedback, self.last_sent, strict=True):
            if ef.residual is None:
                ef.residual = torch.zeros(n, dtype=ef.dtype)
            self.codec.decode_into(data, ef.residual, accumulate=True)
        self.last_sent = []

    def apply_outer(self, mean: torch.Tensor, carry: torch.Tensor | None = None) -> None:
        """One outer step with the mean pseudo-gradient; every replica restarts from the result. The
        snapshot it replaces is kept on the host (``previous``): a stage whose sync failed (a replica
        died in it) still holds the older one, and the pipeline can resume where every stage agrees.

        ``carry``: this replica's pseudo-gradient of the sync (``Prepared.pseudo``) when inner steps ran
        while the sync was in flight (an overlapped outer sync): the parameters then move to the new
        snapshot plus what those inner steps did since the sync's point (snapshot - carry), which the
        next sync's pseudo-gradient counts. The snapshot is the same on every replica either way."""
        with torch.no_grad():
            self.previous = [s.detach().to("cpu", copy=True) for s in self.snapshot]
            offset = 0
            for s in self.snapshot:
                n = s.numel()
                s.grad = mean[offset : offset + n].view_as(s).to(s.device, s.dtype).clone()
                offset += n
            self.outer.step()  # snapshot <- snapshot - outer_lr * nesterov(mean pseudo-gradient)
            self.outer.zero_grad(set_to_none=True)
            offset = 0
            for s, p, old in zip(self.snapshot, self.params, self.previous, strict=True):
                if carry is None:
                    p.copy_(s)  # every replica restarts its inner steps from the same point
                    continue
                n = s.numel()
                at_sync = old - carry[offset : offset + n].view_as(old)  # the parameters at the sync
                p.add_((s - at_sync.to(s.device, s.dtype)).to(p.dtype))  # p - at_sync + s
                offset += n
        self.syncs += 1
