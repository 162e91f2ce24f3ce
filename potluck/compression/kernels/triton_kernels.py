# mypy: disable-error-code="no-untyped-def"
# (Triton kernel arguments are pointers and constexprs that take no Python annotations)
"""Triton kernels for the hot paths; the torch code in quantize.py / sparsify.py defines the bits.

- ``quantize_pack``: x = g (+ e) -> block absmax -> bf16 round-up scale -> fixed or stochastic
  rounding -> planar pack -> residual x - code * s, all in one pass over the data;
- ``dequantize``: unpack -> code * s -> store or add into ``out`` in one pass;
- ``randk_positions`` / ``gather`` / ``scatter_add``: shared-seed random-k without index bytes.
The same rounding formula as the torch reference is spelled without ``trunc`` (absent from the
interpreter): trunc(y + copysign(0.5, y)) == where(y >= 0, floor(y + 0.5), -floor(0.5 - y)), exactly,
because negation is exact in IEEE arithmetic. Division is ``div_rn`` (IEEE round to nearest) so GPU
builds cannot swap in an approximate reciprocal.

Import this module only where Triton is installed. On a machine without a GPU, set
``TRITON_INTERPRET=1`` before importing triton to run the kernels on CPU tensors (tests do).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BF16_MAX_BITS = tl.constexpr(0x7F7F0000)  # a jit kernel may read only constexpr globals (compiled for a GPU)


@triton.jit
def _hash32(idx, seed_lo, seed_hi):
    # hashing.py: fmix32(((i ^ lo) * 0x9E3779B1 + hi) mod 2^32) in native uint32 arithmetic
    h = (idx.to(tl.uint32) ^ seed_lo.to(tl.uint32)) * 0x9E3779B1 + seed_hi.to(tl.uint32)
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _quant_kernel(
    g_ptr,
    e_ptr,
    r_ptr,
    code_ptr,
    scale_ptr,
    nblocks,
    seed_lo,
    seed_hi,
    start,
    BLOCK: tl.constexpr,
    BITS: tl.constexpr,
    ROWS: tl.constexpr,
    HAS_E: tl.constexpr,
    WANT_R: tl.constexpr,
    STOCHASTIC: tl.constexpr,
):
    K: tl.constexpr = 8 // BITS
    QMAX: tl.constexpr = (1 << (BITS - 1)) - 1
    OFF: tl.constexpr = 1 << (BITS - 1)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rmask = rows < nblocks
    offs = rows.to(tl.int64)[:, None] * BLOCK + cols[None, :]
    m2 = rmask[:, None]
    x = tl.load(g_ptr + offs, mask=m2, other=0.0).to(tl.float32)
    if HAS_E:
        x = x + tl.load(e_ptr + offs, mask=m2, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    s = amax / QMAX
    sb = tl.minimum(s.to(tl.int32, bitcast=True), BF16_MAX_BITS)
    sb = (sb + 0xFFFF) & -65536
    s = sb.to(tl.float32, bitcast=True)
    sdiv = tl.where(s > 0, s, 1.0)
    y = tl.div_rn(x, sdiv[:, None])
    if STOCHASTIC:
        h = _hash32(offs + start, seed_lo, seed_hi)
        u = (h >> 8).to(tl.float32) * (1.0 / 16777216.0)
        q = tl.floor(y + u)
    else:
        q = tl.where(y >= 0, tl.floor(y + 0.5), -tl.floor(0.5 - y))
    q = tl.minimum(tl.maximum(q, -QMAX), QMAX)
    if WANT_R:
        tl.store(r_ptr + offs, x - q * s[:, None], mask=m2)
    u8 = (q + OFF).to(tl.int32)
    if K == 1:
        tl.store(code_ptr + offs, u8.to(tl.uint8), mask=m2)
    else:
        u3 = tl.reshape(u8, (ROWS, K, BLOCK // K))
        shift = (tl.arange(0, K) * BITS)[None, :, None]
        packed = tl.sum(u3 << shift, axis=1)
        poffs = rows.to(tl.int64)[:, None] * (BLOCK // K) + tl.arange(0, BLOCK // K)[None, :]
        tl.store(code_ptr + poffs, packed.to(tl.uint8), mask=m2)
    tl.store(scale_ptr + rows, (sb >> 16).to(tl.int16), mask=rmask)


@triton.jit
def _dequant_kernel(
    code_ptr,
    scale_ptr,
    out_ptr,
    nblocks,
    BLOCK: tl.constexpr,
    BITS: tl.constexpr,
    ROWS: tl.constexpr,
    ACCUM: tl.constexpr,
):
    K: tl.constexpr = 8 // BITS
    OFF: tl.constexpr = 1 << (BITS - 1)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < nblocks
    m2 = rmask[:, None]
    sbits = tl.load(scale_ptr + rows, mask=rmask, other=0).to(tl.int32)
    s = (sbits << 16).to(tl.float32, bitcast=True)
    poffs = rows.to(tl.int64)[:, None] * (BLOCK // K) + tl.arange(0, BLOCK // K)[None, :]
    p = tl.load(code_ptr + poffs, mask=m2, other=0).to(tl.int32)
    shift = (tl.arange(0, K) * BITS)[None, :, None]
    u = (p[:, None, :] >> shift) & ((1 << BITS) - 1)
    u = tl.reshape(u, (ROWS, BLOCK))
    vals = (u - OFF).to(tl.float32) * s[:, None]
    offs = rows.to(tl.int64)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    if ACCUM:
        vals = vals + tl.load(out_ptr + offs, mask=m2, other=0.0)
    tl.store(out_ptr + offs, vals, mask=m2)


@triton.jit
def _randk_kernel(
    x_ptr,
    out_ptr,
    pos_ptr,
    vals_ptr,
    n,
    k,
    stride,
    seed_lo,
    seed_hi,
    TILE: tl.constexpr,
    MODE: tl.constexpr,
):
    # MODE 0: positions only; 1: gather x[pos] -> vals; 2: out[pos] += vals (positions are unique)
    j = tl.program_id(0) * TILE + tl.arange(0, TILE)
    m = j < k
    j64 = j.to(tl.int64)
    length = tl.where(j64 == k - 1, n - (k - 1) * stride, stride)
    h = _hash32(j64, seed_lo, seed_hi).to(tl.int64)  # uint32 % int is rejected: go through int64
    pos = j64 * stride + h % length
    if MODE == 0:
        tl.store(pos_ptr + j64, pos, mask=m)
    if MODE == 1:
        tl.store(vals_ptr + j64, tl.load(x_ptr + pos, mask=m, other=0.0), mask=m)
    if MODE == 2:
        v = tl.load(vals_ptr + j64, mask=m, other=0.0).to(tl.float32)
        tl.store(out_ptr + pos, tl.load(out_ptr + pos, mask=m, other=0.0) + v, mask=m)


def _rows(block: int) -> int:
    return max(1, min(16, 4096 // block))


def quantize_pack(
    g: torch.Tensor,
    e: torch.Tensor | None,
    block: int,
    bits: int,
    seed: tuple[int, int] | None,
    want_resid: bool,
    start: int = 0,
    resid_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Same contract as kernels.cpu.quant_core (length a multiple of block): scale bits, packed codes,
    residual (into resid_out when given; may alias e)."""
    n = g.numel()
    nb = n // block
    scales = torch.empty(nb, dtype=torch.int16, device=g.device)
    codes = torch.empty(n // (8 // bits), dtype=torch.uint8, device=g.device)
    resid = resid_out if resid_out is not None else (torch.empty(n, device=g.device) if want_resid else None)
    rows = _rows(block)
    lo, hi = seed if seed is not None else (0, 0)
    grid = (triton.cdiv(nb, rows),)
    dummy = scales  # never read when the matching flag is off
    _quant_kernel[grid](
        g,
        e if e is not None else dummy,
        resid if resid is not None else dummy,
        codes,
        scales,
        nb,
        lo,
        hi,
        start,
        BLOCK=block,
        BITS=bits,
        ROWS=rows,
        HAS_E=e is not None,
        WANT_R=want_resid,
        STOCHASTIC=seed is not None,
    )
    return scales, codes, resid


def dequantize(
    packed: torch.Tensor, sbits: torch.Tensor, block: int, bits: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """fp32 values of whole blocks; added into ``out`` when given."""
    nb = sbits.numel()
    accum = out is not None
    target = out if out is not None else torch.empty(nb * block, device=packed.device)
    rows = _rows(block)
    _dequant_kernel[(triton.cdiv(nb, rows),)](
        packed, sbits, target, nb, BLOCK=block, BITS=bits, ROWS=rows, ACCUM=accum
    )
    return target


def _randk(
    mode: int, n: int, stride: int, seed: tuple[int, int], device: torch.device | str, **t: torch.Tensor
) -> None:
    k = math.ceil(n / stride)
    tile = 1024
    dummy = torch.empty(1, device=device)
    _randk_kernel[(triton.cdiv(k, tile),)](
        t.get("x", dummy),
        t.get("out", dummy),
        t.get("pos", dummy),
        t.get("vals", dummy),
        n,
        k,
        stride,
        seed[0],
        seed[1],
        TILE=tile,
        MODE=mode,
    )


def randk_positions(n: int, stride: int, seed: tuple[int, int], device: torch.device | str) -> torch.Tensor:
    pos = torch.empty(math.ceil(n / stride), dtype=torch.int64, device=device)
    _randk(0, n, stride, seed, device, pos=pos)
    return pos


def gather(x: torch.Tensor, stride: int, seed: tuple[int, int]) -> torch.Tensor:
    vals = torch.empty(math.ceil(x.numel() / stride), dtype=x.dtype, device=x.device)
    _randk(1, x.numel(), stride, seed, x.device, x=x, vals=vals)
    return vals


def scatter_add(out: torch.Tensor, vals: torch.Tensor, stride: int, seed: tuple[int, int]) -> torch.Tensor:
    _randk(2, out.numel(), stride, seed, out.device, out=out, vals=vals)
    return out
