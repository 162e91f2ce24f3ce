"""``signmag``: 2-bit codes made of a sign and a magnitude class, with two magnitudes per block.

Meant for the values a top-k stage kept (``topk:...|signmag|zstd``): those are all large, so the zero
level of ``int2`` ({-s, 0, s} with s the block's absmax) wastes most of them (on heavy-tailed
pseudo-gradients ~90% of the kept values round to 0 and only their index bytes travel). Here every
kept value keeps its sign and lands on one of two magnitudes:

    per block of ``block`` values (the last block may be short; padding is ignored):
        t    = mean |x|                               (the split between the two classes)
        hi   = mean |x| over |x| > t,  lo = mean |x| over |x| <= t   (0 for an empty class)
        both rounded to bf16 (nearest even), sent as the upper 16 bits of their fp32 patterns
    code = (|x| > t) << 1 | (x < 0);  decoded value = +-(hi if the class bit is set else lo)

Block means are summed in float64, so the order of the reduction (CPU, GPU) does not change the
scales; decoding is an exact product of a bf16 scale and +-1. Sections: scales (2 x int16 per block,
lo then hi), codes (4 per byte, planar within each block as in ``quantize.pack_codes``).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from potluck.compression.errors import DecodeError
from potluck.compression.spec import Param
from potluck.compression.stages.base import SectionReader, StageCtx, ValueStage, tensor_from
from potluck.compression.stages.quantize import pack_codes, unpack_codes
from potluck.compression.wire import Section, as_bytes_array


def _check_block(v: int) -> str | None:
    if v < 8 or v > 4096 or v & (v - 1):
        return "must be a power of two in 8..4096"
    return None


def _bf16_bits(v: torch.Tensor) -> torch.Tensor:
    """int16 upper halves of the fp32 patterns of v rounded to bf16 (round to nearest even)."""
    return (v.to(torch.float32).to(torch.bfloat16).to(torch.float32).view(torch.int32) >> 16).to(torch.int16)


def _from_bits(bits: torch.Tensor) -> torch.Tensor:
    return (bits.to(torch.int32) << 16).view(torch.float32)


class SignMagStage(ValueStage):
    """2 bits per value (sign, magnitude class) plus two bf16 magnitudes per block."""

    PARAMS: ClassVar[dict[str, Param]] = {"block": Param(int, 64, _check_block)}
    n_sections = 2

    def _sizes(self, n: int) -> tuple[int, int, int]:
        block = self.p["block"]
        nb = math.ceil(n / block)
        return nb, 4 * nb, nb * block // 4

    def encode(
        self, x: torch.Tensor, ctx: StageCtx, want_recon: bool
    ) -> tuple[list[Section], torch.Tensor | None]:
        x = x.to(torch.float32).reshape(-1)
        n, block = x.numel(), self.p["block"]
        nb, _sb, _cb = self._sizes(n)
        xb = torch.zeros(nb * block, dtype=torch.float32, device=x.device)
        xb[:n] = x
        xb = xb.view(nb, block)
        valid = (torch.arange(nb * block, device=x.device) < n).view(nb, block)
        a = xb.abs().to(torch.float64)
        count = valid.sum(1).clamp_min(1)
        t = a.sum(1) / count
        big = (a > t[:, None]) & valid
        small = valid & ~big
        hi = (a * big).sum(1) / big.sum(1).clamp_min(1)
        lo = (a * small).sum(1) / small.sum(1).clamp_min(1)
        scale_bits = torch.stack([_bf16_bits(lo), _bf16_bits(hi)], dim=1).reshape(-1)
        codes = (big.to(torch.int32) << 1) | (xb < 0).to(torch.int32)
        packed = pack_codes(codes - 2, 2)  # pack_codes stores code + 2: this stores codes 0..3
        sections = [Section(as_bytes_array(scale_bits.cpu()), 2), Section(as_bytes_array(packed.cpu()), 1)]
        recon = None
        if want_recon:
            recon = self._values(scale_bits, codes, nb, block)[:n]
        return sections, recon

    @staticmethod
    def _values(scale_bits: torch.Tensor, codes: torch.Tensor, nb: int, block: int) -> torch.Tensor:
        s = _from_bits(scale_bits).view(nb, 2)
        mag = torch.where((codes >> 1).bool(), s[:, 1:2], s[:, 0:1])
        return torch.where((codes & 1).bool(), -mag, mag).reshape(-1)

    def decode(self, r: SectionReader, n: int, ctx: StageCtx) -> torch.Tensor:
        nb, sb, cb = self._sizes(n)
        scale_bits = tensor_from(r.take(sb, "signmag scales"), torch.int16)
        packed = tensor_from(r.take(cb, "signmag codes"), torch.uint8)
        if n == 0:
            return torch.zeros(0)
        s = _from_bits(scale_bits)
        if not bool(torch.isfinite(s).all()) or bool((s < 0).any()):
            raise DecodeError("signmag scales must be finite and non-negative")
        codes = unpack_codes(packed, 2, self.p["block"]).to(torch.int32) + 2
        return self._values(scale_bits, codes, nb, self.p["block"])[:n]

    def nbytes(self, n: int, dtype: torch.dtype) -> int:
        _nb, sb, cb = self._sizes(n)
        return sb + cb
