"""Blockwise absmax quantization to int8 / int4 / int2 with a fixed, portable rounding rule.

Per block of ``block`` elements (the last block may be short):
    s      = bf16_round_up(absmax / qmax), qmax = 2^(bits-1) - 1 (127, 7, 1)
             (round up in bf16 so |x / s| <= qmax; s is sent as the upper 16 bits of its fp32 pattern)
    y      = x / s (IEEE fp32 division; s == 0 divides by 1, all codes are then 0)
    code   = trunc(y + copysign(0.5, y))   round half away from zero, == sign(y) * floor(|y| + 0.5)
             or, with stochastic rounding, floor(y + u), u from hashing.uniform(seed, element index)
    code   = clamp(code, -qmax, qmax); stored offset-binary: u = code + 2^(bits-1)
Packing is planar within each block (the last block is zero-padded to full size): with k = 8 / bits
codes per byte, byte j of a block holds elements j, j + B/k, ..., j + (k-1) B/k at bit offsets 0, bits,
..., so packing reads contiguous runs (fast on CPU SIMD and coalesced on GPU).
Dequantization is code * s, which is exact in fp32 (a 7-bit code times an 8-bit mantissa), so every
decoder on every platform yields the same bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from potluck.compression.hashing import stream_seed, uniform
from potluck.compression.kernels import cpu, dispatch, native_ops
from potluck.compression.spec import Param
from potluck.compression.stages.base import SectionReader, StageCtx, ValueStage, tensor_from
from potluck.compression.wire import Section, as_bytes_array

BF16_MAX_BITS = 0x7F7F0000  # largest finite bf16, as fp32 bits
SUPPORTED_BITS = (8, 4, 2)


def qmax_of(bits: int) -> int:
    return (1 << (bits - 1)) - 1


def per_byte(bits: int) -> int:
    return 8 // bits


@dataclass
class Quantized:
    scale_bits: torch.Tensor  # int16 [nblocks]: upper half of the fp32 pattern of each scale
    packed: torch.Tensor  # uint8 [ceil(n / per_byte)]
    recon: torch.Tensor | None  # fp32 [n] dequantized values, when asked for


def round_up_bf16(s: torch.Tensor) -> torch.Tensor:
    """Smallest bf16-representable fp32 >= s, for finite s >= 0 (clamped to the largest finite bf16)."""
    bits = s.view(torch.int32)
    bits = torch.clamp(bits, max=BF16_MAX_BITS)
    bits = (bits + 0xFFFF) & -65536
    return bits.view(torch.float32)


def scales_from_bits(scale_bits: torch.Tensor) -> torch.Tensor:
    return (scale_bits.to(torch.int32) << 16).view(torch.float32)


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    n = x.numel()
    nb = math.ceil(n / block)
    pad = nb * block - n
    if pad:
        x = torch.cat([x, x.new_zeros(pad)])
    return x.view(nb, block)


def quantize_codes(
    x: torch.Tensor, bits: int, block: int, seed: tuple[int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference quantizer: (scales fp32 [nb], codes fp32 [nb, block]) for 1-D fp32 x (zero-padded)."""
    qmax = qmax_of(bits)
    xb = _blocks(x, block)
    s = round_up_bf16(xb.abs().amax(dim=1) / qmax)
    sdiv = torch.where(s > 0, s, torch.ones_like(s))
    y = xb / sdiv[:, None]
    if seed is None:
        y = y.add_(torch.sign(y).mul_(0.5)).trunc_()
    else:
        u = uniform(y.numel(), seed, device=y.device).view_as(y)
        y = y.add_(u).floor_()
    return s, y.clamp_(-qmax, qmax)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Planar offset-binary packing of codes [nb, block]: byte j of a block holds elements
    j + i * block / k at bit offset bits * i (k = 8 / bits codes per byte)."""
    k = per_byte(bits)
    u = (codes + (1 << (bits - 1))).to(torch.int32)
    nb, block = u.shape
    u = u.view(nb, k, block // k)
    acc = u[:, 0]
    for i in range(1, k):
        acc = acc | (u[:, i] << (bits * i))
    return acc.to(torch.uint8).reshape(-1)


def unpack_codes(packed: torch.Tensor, bits: int, block: int) -> torch.Tensor:
    """Inverse of pack_codes: signed int16 codes [nb, block]."""
    k = per_byte(bits)
    p = packed.to(torch.int16).view(-1, 1, block // k)
    mask = (1 << bits) - 1
    u = torch.cat([(p >> (bits * i)) & mask for i in range(k)], dim=1)
    return u.view(-1, block) - (1 << (bits - 1))


def quantize(
    x: torch.Tensor, bits: int, block: int, seed: tuple[int, int] | None = None, want_recon: bool = False
) -> Quantized:
    """Reference: quantize 1-D fp32 x; optionally return the dequantized values (for error feedback)."""
    n = x.numel()
    s, codes = quantize_codes(x, bits, block, seed)
    scale_bits = (s.view(torch.int32) >> 16).to(torch.int16)
    recon = (codes * s[:, None]).reshape(-1)[:n] if want_recon else None
    return Quantized(scale_bits, pack_codes(codes, bits), recon)


def dequantize(scale_bits: torch.Tensor, packed: torch.Tensor, bits: int, block: int, n: int) -> torch.Tensor:
    """Reference: fp32 [n] values from scales and packed codes."""
    s = scales_from_bits(scale_bits)
    codes = unpack_codes(packed, bits, block).to(torch.float32)
    return (codes * s[:, None]).reshape(-1)[:n]


def nbytes(n: int, bits: int, block: int) -> tuple[int, int]:
    """(scale bytes, code bytes) for n elements; the last block is padded to full size."""
    nb = math.ceil(n / block)
    return 2 * nb, nb * block // per_byte(bits)


def _check_block(v: int) -> str | None:
    if v < 32 or v > 4096 or v & (v - 1):
        return "must be a power of two in 32..4096"
    return None


class QuantStage(ValueStage):
    """``int8`` / ``int4`` / ``int2``: blockwise absmax codes; sections: scales (bf16 bits), codes."""

    PARAMS: ClassVar[dict[str, Param]] = {
        "block": Param(int, 64, _check_block),
        "rounding": Param(
            str, "nearest", lambda v: None if v in ("nearest", "stochastic") else "nearest|stochastic"
        ),
        "seed": Param(int, 0, lambda v: None if 0 <= v < 2**63 else "must be in 0..2^63-1"),
    }
    n_sections = 2
    SALT = 1  # separates this stage's random stream from random-k's under the same key

    @property
    def bits(self) -> int:
        return int(self.name[3:])

    def rounding_seed(self, ctx: StageCtx) -> tuple[int, int] | None:
        if self.p["rounding"] != "stochastic":
            return None
        return stream_seed(ctx.key64 or 0, self.p["seed"], self.SALT)

    def encode(
        self, x: torch.Tensor, ctx: StageCtx, want_recon: bool
    ) -> tuple[list[Section], torch.Tensor | None]:
        x = x.to(torch.float32).contiguous()
        sections, resid, _finite = self.encode_dense(x, None, want_recon, ctx)
        return sections, (x - resid if resid is not None else None)

    def encode_dense(
        self,
        flat: torch.Tensor,
        residual: torch.Tensor | None,
        want_resid: bool,
        ctx: StageCtx,
        resid_out: torch.Tensor | None = None,
    ) -> tuple[list[Section], torch.Tensor | None, bool]:
        """(sections, new residual = flat + residual - decoded, all finite) in one fused pass.
        Whole blocks go through kernels.cpu (compiled when large); a short last block is zero-padded."""
        bits, block = self.bits, self.p["block"]
        seed = self.rounding_seed(ctx)
        lo, hi = seed if seed is not None else (0, 0)
        sto = seed is not None
        n = flat.numel()
        full = (n // block) * block
        outs = []
        # the new residual goes into a caller-provided buffer (ErrorFeedback double-buffers, so it never
        # aliases `residual` and nothing is allocated per call); else into a fresh one
        out_buf = resid_out
        if want_resid and out_buf is None:
            out_buf = torch.empty(n, dtype=torch.float32, device=flat.device)
        if n and flat.device.type == "cpu" and native_ops.usable(out_buf):
            # one native pass over every block, the short last one included
            x = flat.to(torch.float32).contiguous()
            e = residual.to(torch.float32).contiguous() if residual is not None else None
            sbits, packed, finite = native_ops.quantize(x, e, out_buf, block, bits, seed)
            sections = [Section(as_bytes_array(sbits), 2), Section(as_bytes_array(packed), 1)]
            return sections, out_buf, finite
        if full:
            e = residual[:full] if residual is not None else None
            ob = out_buf[:full] if out_buf is not None else None
            outs.append(dispatch.quantize(flat[:full], e, block, bits, seed, want_resid, 0, ob))
        if full < n:
            tail = torch.zeros(block, dtype=torch.float32, device=flat.device)
            tail[: n - full] = flat[full:]
            if residual is not None:
                tail[: n - full] += residual[full:]
            sb, pk, rs, ok = cpu.quant_core(tail, None, block, bits, lo, hi, sto, want_resid, full)
            if rs is not None and out_buf is not None:
                out_buf[full:] = rs[: n - full]
            outs.append((sb, pk, None, ok))
        if not outs:
            empty = torch.empty(0, dtype=torch.int16)
            sections = [Section(as_bytes_array(empty), 2), Section(as_bytes_array(empty.to(torch.uint8)))]
            return sections, (torch.empty(0) if want_resid else None), True
        # torch.cat copies even a single tensor: skip it in the common one-part case
        sbits = torch.cat([o[0] for o in outs]) if len(outs) > 1 else outs[0][0]
        packed = torch.cat([o[1] for o in outs]) if len(outs) > 1 else outs[0][1]
        resid = out_buf if want_resid else None
        finite = all(bool(o[3]) for o in outs)
        return [Section(as_bytes_array(sbits), 2), Section(as_bytes_array(packed), 1)], resid, finite

    def _read(self, r: SectionReader, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        sb, cb = nbytes(n, self.bits, self.p["block"])
        scale_bits = tensor_from(r.take(sb, "scales"), torch.int16)
        packed = tensor_from(r.take(cb, "codes"), torch.uint8)
        return scale_bits, packed

    def decode(self, r: SectionReader, n: int, ctx: StageCtx) -> torch.Tensor:
        sbits, packed = self._read(r, n)
        if n == 0:
            return torch.zeros(0)
        if native_ops.usable():
            out = torch.empty(n, dtype=torch.float32)
            native_ops.dequantize_to(
                packed.data_ptr(), sbits.data_ptr(), n, self.p["block"], self.bits, out, False
            )
            return out
        return dispatch.dequantize(packed, sbits, self.p["block"], self.bits)[:n]

    def decode_add(self, r: SectionReader, n: int, ctx: StageCtx, out: torch.Tensor) -> None:
        sbits, packed = self._read(r, n)
        block = self.p["block"]
        if n and native_ops.usable(out):
            native_ops.dequantize_to(packed.data_ptr(), sbits.data_ptr(), n, block, self.bits, out, True)
            return
        full = (n // block) * block
        if full:
            nbf = full // per_byte(self.bits)
            # compiled dequantize, then an eager add: Inductor's in-place variant measured ~3x slower
            out[:full] += dispatch.dequantize(packed[:nbf], sbits[: full // block], block, self.bits)
        if full < n:
            nbf = full // per_byte(self.bits)
            tail = cpu.dequant_core(packed[nbf:], sbits[full // block :], block, self.bits, None)
            out[full:] += tail[: n - full]

    def nbytes(self, n: int, dtype: torch.dtype) -> int:
        return sum(nbytes(n, self.bits, self.p["block"]))
