"""Activation-delta coding (AC-SGD): send low-bit *changes* of each sample's activation.

Sender and receiver each keep a cache sample_id -> last reconstructed activation. On a sample's first
visit its activation goes out directly (``first`` bits); on later visits only Q(a - cache) goes out
(``bits`` bits) and both sides set cache = cache + decoded delta. Both sides decode the same bytes with
the same exact dequantizer, so the caches stay identical bit for bit.

The cache is an LRU of ``capacity`` entries, in RAM or (``disk_dir``) as .npy files; both sides must use
the same capacity (it travels in the spec so the receiver can check). When samples are not revisited
(single-pass pretraining) the hit rate stays near 0: after ``warmup`` lookups with a hit rate under
``min_hit_rate`` the coder switches caching off for good, frees the cache and tells the receiver to do
the same (flag in the payload). Per-sample modes: 0 direct, not cached; 1 direct, cached; 2 delta.

Payload sections (each zstd-compressed where that pays, unless ``zstd=False``): meta
(``u8 flags, u32 batch``, then per sample ``u64 id, u8 mode``), then the first-visit values and the
delta values, each coded by a blockwise quantizer (or fp16 for 16 bits).
"""

from __future__ import annotations

import logging
import struct
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from potluck.compression.errors import DecodeError, EncodeError
from potluck.compression.stages.base import SectionReader, StageCtx, ValueStage
from potluck.compression.stages.cast import Fp16Stage
from potluck.compression.stages.lossless import ZstdStage
from potluck.compression.stages.quantize import QuantStage
from potluck.compression.wire import Header, Section, pack, unpack_header, unpack_sections

logger = logging.getLogger(__name__)
_ENTRY = struct.Struct("<QB")
DIRECT, DIRECT_CACHED, DELTA = 0, 1, 2


class ActivationCache:
    """LRU sample_id -> fp16 tensor, in RAM or spilled to one .npy file per entry under disk_dir."""

    def __init__(self, capacity: int, disk_dir: str | Path | None = None) -> None:
        if capacity < 1:
            raise EncodeError("activation cache capacity must be >= 1")
        self.capacity = capacity
        self.disk = Path(disk_dir) if disk_dir is not None else None
        if self.disk is not None:
            self.disk.mkdir(parents=True, exist_ok=True)
        self._ram: OrderedDict[int, torch.Tensor | None] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._ram)

    def __contains__(self, sid: int) -> bool:
        return sid in self._ram

    def _path(self, sid: int) -> Path:
        assert self.disk is not None
        return self.disk / f"{sid:016x}.npy"

    def get(self, sid: int) -> torch.Tensor:
        self._ram.move_to_end(sid)
        t = self._ram[sid]
        return t if t is not None else torch.from_numpy(np.load(self._path(sid)))

    def put(self, sid: int, value: torch.Tensor) -> None:
        v = value.to(torch.float16).contiguous()
        if sid in self._ram:
            self._drop(sid)
        if self.disk is not None:
            np.save(self._path(sid), v.numpy())
            self._ram[sid] = None
        else:
            self._ram[sid] = v
        self.nbytes += v.numel() * 2
        while len(self._ram) > self.capacity:
            self._drop(next(iter(self._ram)))

    def _drop(self, sid: int) -> None:
        t = self._ram.pop(sid)
        if t is None:
            path = self._path(sid)
            self.nbytes -= path.stat().st_size - 128  # .npy header is 128 bytes
            path.unlink()
        else:
            self.nbytes -= t.numel() * 2

    def clear(self) -> None:
        for sid in list(self._ram):
            self._drop(sid)
        self.nbytes = 0


def _value_stage(bits: int, block: int) -> ValueStage:
    if bits == 16:
        return Fp16Stage("fp16", {})
    return QuantStage(f"int{bits}", {"block": str(block)})


class DeltaCoder:
    """One direction of one pipeline boundary: the sender and the receiver each own one."""

    def __init__(
        self,
        bits: int = 2,
        first: int = 8,
        block: int = 64,
        capacity: int = 10000,
        disk_dir: str | Path | None = None,
        min_hit_rate: float = 0.05,
        warmup: int | None = None,
        zstd: bool = True,
    ) -> None:
        if bits not in (2, 4, 8, 16) or first not in (2, 4, 8, 16):
            raise EncodeError("bits and first must be 2, 4, 8 or 16")
        self.bits, self.first, self.block = bits, first, block
        self.cache = ActivationCache(capacity, disk_dir)
        self.spec = f"delta:bits={bits},block={block},cap={capacity},first={first},zstd={int(zstd)}"
        # small deltas quantize mostly to the zero code, which zstd squeezes well below `bits`
        self._zstd = ZstdStage("zstd", {}) if zstd else None
        self.min_hit_rate = min_hit_rate
        self.warmup = warmup if warmup is not None else max(1024, 2 * capacity)
        self.enabled = True
        self.lookups = 0
        self.hits = 0
        self._direct = _value_stage(first, block)
        self._delta = _value_stage(bits, block)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def _maybe_switch_off(self) -> None:
        if self.enabled and self.lookups >= self.warmup and self.hit_rate < self.min_hit_rate:
            logger.info(
                "activation-delta cache off: hit rate %.3f after %d lookups (samples are not revisited)",
                self.hit_rate,
                self.lookups,
            )
            self.enabled = False
            self.cache.clear()

    def encode(self, acts: torch.Tensor, sample_ids: Sequence[int]) -> bytes:
        """Payload for a batch [B, ...] whose row i belongs to sample_ids[i]."""
        if acts.dim() < 1 or acts.shape[0] != len(sample_ids):
            raise EncodeError(f"{len(sample_ids)} sample ids for a batch of shape {tuple(acts.shape)}")
        if len(set(sample_ids)) != len(sample_ids):
            raise EncodeError("sample ids in one batch must be distinct")
        rows = acts.detach().reshape(len(sample_ids), -1).to(torch.float32)
        if not bool(torch.isfinite(rows).all()):
            raise EncodeError("activations hold NaN or Inf")
        self._maybe_switch_off()
        modes = []
        for sid in sample_ids:
            hit = self.enabled and sid in self.cache
            self.lookups += 1
            self.hits += int(hit)
            modes.append(DELTA if hit else DIRECT_CACHED if self.enabled else DIRECT)
        direct = [i for i, m in enumerate(modes) if m != DELTA]
        delta = [i for i, m in enumerate(modes) if m == DELTA]
        base = torch.stack([self.cache.get(sample_ids[i]).float() for i in delta]) if delta else None
        ctx = StageCtx(torch.float32, tuple(acts.shape), None)
        meta = struct.pack("<BI", 0 if self.enabled else 1, len(sample_ids))
        meta += b"".join(_ENTRY.pack(int(sid), m) for sid, m in zip(sample_ids, modes, strict=True))
        sections = [Section(np.frombuffer(meta, dtype=np.uint8).copy())]
        sections += self._direct.encode(rows[direct].reshape(-1), ctx, False)[0]
        dvals = (rows[delta] - base).reshape(-1) if base is not None else torch.zeros(0)
        sections += self._delta.encode(dvals, ctx, False)[0]
        # update our cache from the bytes themselves, exactly as the receiver will
        self._apply(SectionReader(sections[1:]), sample_ids, modes, rows.shape[1], base, ctx)
        if self._zstd is not None:
            sections = self._zstd.compress(sections)
        return pack(
            Header(
                acts.dtype if acts.dtype.is_floating_point else torch.float32,
                tuple(acts.shape),
                self.spec,
                None,
                0,
            ),
            sections,
        )

    def _apply(
        self,
        r: SectionReader,
        sample_ids: Sequence[int],
        modes: list[int],
        width: int,
        base: torch.Tensor | None,
        ctx: StageCtx,
    ) -> torch.Tensor:
        direct = [i for i, m in enumerate(modes) if m != DELTA]
        delta = [i for i, m in enumerate(modes) if m == DELTA]
        out = torch.empty(len(modes), width)
        if direct:
            out[direct] = self._direct.decode(r, len(direct) * width, ctx).float().view(len(direct), width)
        else:
            self._direct.decode(r, 0, ctx)
        if delta:
            assert base is not None
            d = self._delta.decode(r, len(delta) * width, ctx).float().view(len(delta), width)
            out[delta] = (base + d).to(torch.float16).float()
        else:
            self._delta.decode(r, 0, ctx)
        r.done()
        for i, (sid, m) in enumerate(zip(sample_ids, modes, strict=True)):
            if m != DIRECT:
                self.cache.put(sid, out[i])
        return out

    def decode(self, data: bytes | bytearray | memoryview) -> torch.Tensor:
        """The batch a sender's ``encode`` produced; updates this (receiver's) cache the same way."""
        header, off = unpack_header(data)
        if header.spec != self.spec:
            raise DecodeError(f"payload coded with {header.spec!r}, this receiver expects {self.spec!r}")
        sections = unpack_sections(data, off, header.payload_len)
        if self._zstd is not None:
            sections = self._zstd.decompress(sections)
        if not sections:
            raise DecodeError("delta payload without a meta section")
        meta = sections[0].data.tobytes()
        if len(meta) < 5:
            raise DecodeError("delta meta section is truncated")
        flags, batch = struct.unpack_from("<BI", meta)
        if len(meta) != 5 + batch * _ENTRY.size or not header.shape or header.shape[0] != batch:
            raise DecodeError("delta meta section does not match the batch size")
        entries = [_ENTRY.unpack_from(meta, 5 + i * _ENTRY.size) for i in range(batch)]
        sample_ids = [e[0] for e in entries]
        modes = [e[1] for e in entries]
        if flags & 1 and self.enabled:
            self.enabled = False
            self.cache.clear()
        if any(m not in (DIRECT, DIRECT_CACHED, DELTA) for m in modes):
            raise DecodeError("unknown per-sample mode")
        missing = [s for s, m in zip(sample_ids, modes, strict=True) if m == DELTA and s not in self.cache]
        if missing:
            raise DecodeError(f"delta for samples not in the receiver cache (out of sync): {missing[:5]}")
        delta = [sample_ids[i] for i, m in enumerate(modes) if m == DELTA]
        base = torch.stack([self.cache.get(s).float() for s in delta]) if delta else None
        width = header.numel // batch if batch else 0
        ctx = StageCtx(torch.float32, header.shape, None)
        out = self._apply(SectionReader(sections[1:]), sample_ids, modes, width, base, ctx)
        return out.to(header.dtype).view(header.shape)
