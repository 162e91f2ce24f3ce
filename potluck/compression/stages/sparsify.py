"""Select stages: ``topk`` (sampled or chunked threshold) and ``randk`` (shared seed, no index bytes).

Index coding for top-k (meta section ``u8 mode, u8 width, u32 k``):
- mode 0, gaps: ``g_i = p_i - p_{i-1} - 1`` (p_{-1} = -1) as u8/u16/u32, the narrowest that fits;
- mode 1, bitmask: n bits, little-endian bit order, whichever is smaller.
Random-k keeps one element per stratum of C = round(1 / density) elements, at offset
``h(j) mod L_j`` within stratum j (L_j = C except a short last stratum), with h from hashing.py seeded by
the payload key: the receiver recomputes the positions, so no index bytes are sent.
"""

from __future__ import annotations

import math
import struct
from typing import ClassVar

import numpy as np
import torch

from potluck.compression.errors import DecodeError, EncodeError
from potluck.compression.hashing import hash_indices, stream_seed
from potluck.compression.kernels import dispatch
from potluck.compression.spec import Param, parse_bool
from potluck.compression.stages.base import SectionReader, SelectStage, StageCtx, tensor_from
from potluck.compression.wire import Section, as_bytes_array

_META = struct.Struct("<BBI")
_GAP_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
_MAX_INDEXED = 1 << 32


def _density(v: float) -> str | None:
    return None if 0.0 < v <= 1.0 else "must be in (0, 1]"


def encode_positions(pos: torch.Tensor, n: int) -> list[Section]:
    """Gap- or bitmask-coded sorted unique int64 positions."""
    k = pos.numel()
    if k:
        prev = torch.cat([pos.new_full((1,), -1), pos[:-1]])
        gaps = pos - prev - 1
        gmax = int(gaps.max())
    else:
        gaps, gmax = pos, 0
    width = 1 if gmax < 1 << 8 else 2 if gmax < 1 << 16 else 4
    if k * width <= math.ceil(n / 8):
        # int16/int32 hold u16/u32 gap bit patterns; the decoder reinterprets them as unsigned
        stored = gaps.to(torch.int64)
        if width == 2:
            stored = torch.where(stored >= 1 << 15, stored - (1 << 16), stored)
        elif width == 4:
            stored = torch.where(stored >= 1 << 31, stored - (1 << 32), stored)
        data = as_bytes_array(stored.to(_GAP_DTYPES[width]))
        return [Section(np.frombuffer(_META.pack(0, width, k), dtype=np.uint8).copy()), Section(data, width)]
    mask = np.zeros(n, dtype=bool)
    mask[pos.cpu().numpy()] = True
    bits = np.packbits(mask, bitorder="little")
    return [Section(np.frombuffer(_META.pack(1, 1, k), dtype=np.uint8).copy()), Section(bits)]


def decode_positions(r: SectionReader, n: int) -> torch.Tensor:
    mode, width, k = _META.unpack(r.take(_META.size, "index meta").tobytes())
    if k > n:
        raise DecodeError(f"index section declares {k} positions for {n} elements")
    if mode == 0:
        if width not in _GAP_DTYPES:
            raise DecodeError(f"bad gap width {width}")
        raw = tensor_from(r.take(k * width, "index gaps"), _GAP_DTYPES[width]).to(torch.int64)
        gaps = raw & ((1 << (8 * width)) - 1)
        pos = torch.cumsum(gaps + 1, 0) - 1
        if k and int(pos[-1]) >= n:
            raise DecodeError("index gaps run past the end of the tensor")
        return pos
    if mode == 1:
        bits = r.take(math.ceil(n / 8), "index bitmask")
        mask = np.unpackbits(bits, count=None, bitorder="little")
        if mask[n:].any():
            raise DecodeError("bitmask has bits set past the end of the tensor")
        pos = torch.from_numpy(np.flatnonzero(mask[:n]).astype(np.int64))
        if pos.numel() != k:
            raise DecodeError(f"bitmask holds {pos.numel()} positions, meta says {k}")
        return pos
    raise DecodeError(f"unknown index mode {mode}")


class TopKStage(SelectStage):
    """Keep about density * n entries of largest magnitude."""

    PARAMS: ClassVar[dict[str, Param]] = {
        "density": Param(float, 0.01, _density),
        "method": Param(str, "sample", lambda v: None if v in ("sample", "chunk") else "sample|chunk"),
        "chunk": Param(int, 256, lambda v: None if 2 <= v <= 1 << 16 else "must be 2..65536"),
        "sample": Param(int, 65536, lambda v: None if 64 <= v <= 1 << 24 else "must be 64..2^24"),
    }

    def expected_k(self, n: int) -> int:
        return min(n, max(1, round(self.p["density"] * n))) if n else 0

    def index_bytes(self, n: int) -> int:
        k = self.expected_k(n)
        mean_gap = n / max(k, 1)
        width = 1 if mean_gap < 128 else 2 if mean_gap < 1 << 15 else 4  # typical max gap ~ 2x the mean
        return _META.size + min(k * width, math.ceil(n / 8))

    def select(self, x: torch.Tensor, ctx: StageCtx) -> tuple[list[Section], torch.Tensor]:
        n = x.numel()
        if n >= _MAX_INDEXED:
            raise EncodeError("top-k needs fewer than 2^32 elements per payload; split the tensor into parts")
        k = self.expected_k(n)
        a = x.abs()
        if k >= n:
            pos = torch.arange(n, device=x.device)
        elif self.p["method"] == "chunk":
            pos = self._chunked(a, n)
        else:
            pos = self._sampled(a, n)
        return encode_positions(pos, n), pos

    def _sampled(self, a: torch.Tensor, n: int) -> torch.Tensor:
        # Threshold from a strided sample instead of a global sort: ~1 pass + a small topk.
        stride = max(1, n // self.p["sample"])
        sample = a[::stride]
        ks = max(1, math.ceil(self.p["density"] * sample.numel()))
        thr = torch.topk(sample, ks, sorted=False).values.min()
        mask = a > 0 if float(thr) == 0.0 else a >= thr
        return mask.nonzero().squeeze(1)

    def _chunked(self, a: torch.Tensor, n: int) -> torch.Tensor:
        c = self.p["chunk"]
        rows = math.ceil(n / c)
        if rows * c != n:
            a = torch.cat([a, a.new_full((rows * c - n,), -1.0)])  # padding is never selected
        kc = max(1, round(self.p["density"] * c))
        off = torch.topk(a.view(rows, c), kc, dim=1, sorted=False).indices
        pos = (off + torch.arange(rows, device=a.device)[:, None] * c).reshape(-1)
        pos = pos[pos < n]
        return torch.sort(pos).values

    def positions(self, r: SectionReader, n: int, ctx: StageCtx) -> torch.Tensor:
        return decode_positions(r, n)


class RandKStage(SelectStage):
    """One entry per stratum of C = round(1/density) entries; positions derive from the payload key."""

    PARAMS: ClassVar[dict[str, Param]] = {
        "density": Param(float, 0.1, _density),
        "seed": Param(int, 0, lambda v: None if 0 <= v < 2**63 else "must be in 0..2^63-1"),
        "unbiased": Param(parse_bool, False),
    }
    SALT = 2

    @property
    def stride(self) -> int:
        return max(1, round(1.0 / self.p["density"]))

    def expected_k(self, n: int) -> int:
        return math.ceil(n / self.stride)

    def index_bytes(self, n: int) -> int:
        return 0

    def seed(self, ctx: StageCtx) -> tuple[int, int]:
        if ctx.key64 is None:
            raise EncodeError("randk derives its positions from the key: pass key=(round, tensor, part)")
        return stream_seed(ctx.key64, self.p["seed"], self.SALT)

    def compute_positions(self, n: int, ctx: StageCtx, device: torch.device | str = "cpu") -> torch.Tensor:
        if n >= _MAX_INDEXED:
            raise EncodeError("randk needs fewer than 2^32 elements per payload; split the tensor into parts")
        c, k = self.stride, self.expected_k(n)
        fast = dispatch.randk_positions(n, c, self.seed(ctx), torch.device(device)) if k else None
        if fast is not None:
            return fast
        j = torch.arange(k, dtype=torch.int64, device=device)
        lengths = torch.full((k,), c, dtype=torch.int64, device=device)
        if k:
            lengths[-1] = n - (k - 1) * c
        return j * c + hash_indices(j, self.seed(ctx)) % lengths

    def select(self, x: torch.Tensor, ctx: StageCtx) -> tuple[list[Section], torch.Tensor]:
        return [], self.compute_positions(x.numel(), ctx, x.device)

    def positions(self, r: SectionReader, n: int, ctx: StageCtx) -> torch.Tensor:
        try:
            return self.compute_positions(n, ctx)
        except EncodeError as exc:
            raise DecodeError(str(exc)) from exc

    def value_scale(self, n: int) -> torch.Tensor | None:
        """Per-kept-entry factor making the estimate unbiased (the stratum length), if asked for."""
        if not self.p["unbiased"]:
            return None
        c, k = self.stride, self.expected_k(n)
        scale = torch.full((k,), float(c))
        if k:
            scale[-1] = float(n - (k - 1) * c)
        return scale
