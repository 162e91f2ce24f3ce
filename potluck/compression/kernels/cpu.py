"""Fused quantize(+error feedback)+pack and unpack+dequantize(+accumulate) for the dense int path.

The same Python functions run eagerly or through ``torch.compile`` (Inductor C++), which fuses them
into one or two passes: 10-14x faster than eager on this project's 2-core CI box (measured by
scripts/bench_codecs.py). The rules are those of quantize.py; tests check that both backends give
identical bytes. Backend choice, by ``POTLUCK_CODEC_BACKEND``:
  ``auto`` (default) compile for tensors of at least ``COMPILE_MIN_ELEMENTS`` (compiling takes ~10 s
  once per process and bit width, which small tensors never repay), eager below;
  ``eager`` never compile; ``compile`` always compile.
If compilation fails (no C++ compiler, for instance) we log once and stay eager.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

BF16_MAX_BITS = 0x7F7F0000
M32 = 0xFFFFFFFF
COMPILE_MIN_ELEMENTS = 1 << 20
_compiled: dict[str, Callable[..., Any]] = {}
_broken = False


def quant_core(
    g: torch.Tensor,
    e: torch.Tensor | None,
    block: int,
    bits: int,
    seed_lo: int,
    seed_hi: int,
    stochastic: bool,
    want_resid: bool,
    start: int = 0,
    resid_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """g (and e): 1-D, length a multiple of block. Returns (scale bits int16, packed uint8,
    residual fp32 or None, all-finite flag as a 0-d bool tensor). With ``resid_out`` (which may be e
    itself) the residual is written in place: no fresh 4-byte-per-element allocation, whose page
    faults otherwise cost more than the arithmetic."""
    x = g.to(torch.float32) if e is None else g.to(torch.float32) + e.to(torch.float32)
    xb = x.view(-1, block)
    amax = xb.abs().amax(dim=1, keepdim=True)
    qmax = (1 << (bits - 1)) - 1
    s = amax / qmax
    sbits = (torch.clamp(s.view(torch.int32), max=BF16_MAX_BITS) + 0xFFFF) & -65536
    s = sbits.view(torch.float32)
    y = xb / torch.where(s > 0, s, torch.ones_like(s))
    if stochastic:
        idx = torch.arange(start, start + xb.numel(), dtype=torch.int64, device=xb.device).view(xb.shape)
        h = ((idx ^ seed_lo) * 0x9E3779B1 + seed_hi) & M32
        h = h ^ (h >> 16)
        h = (h * 0x85EBCA6B) & M32
        h = h ^ (h >> 13)
        h = (h * 0xC2B2AE35) & M32
        h = h ^ (h >> 16)
        q = torch.floor(y + (h >> 8).to(torch.float32) * (2.0**-24))
    else:
        q = torch.trunc(y + torch.where(y >= 0, 0.5, -0.5))
    q = q.clamp(-qmax, qmax)
    k = 8 // bits
    # planar packing (see quantize.py): byte j of a block holds elements j + i * block / k
    uk = (q + (1 << (bits - 1))).to(torch.int32).view(-1, k, block // k)
    acc = uk[:, 0]
    for i in range(1, k):
        acc = acc + uk[:, i] * (1 << (bits * i))
    packed = acc.to(torch.uint8).view(-1)
    resid = (xb - q * s).view(-1) if want_resid else None
    if resid is not None and resid_out is not None:
        resid = resid_out.copy_(resid)
    return (sbits >> 16).to(torch.int16).view(-1), packed, resid, torch.isfinite(amax).all()


def dequant_core(
    packed: torch.Tensor, sbits: torch.Tensor, block: int, bits: int, out: torch.Tensor | None
) -> torch.Tensor:
    """fp32 values of whole blocks, or added in place into ``out`` (same length) when given."""
    s = (sbits.to(torch.int32) << 16).view(torch.float32).view(-1, 1)
    k = 8 // bits
    mask = (1 << bits) - 1
    p32 = packed.to(torch.int32).view(-1, 1, block // k)
    u = torch.cat([(p32 >> (bits * i)) & mask for i in range(k)], dim=1).view(-1)
    vals = ((u.to(torch.float32) - (1 << (bits - 1))).view(-1, block) * s).view(-1)
    return vals if out is None else out.add_(vals)


def _backend(n: int) -> str:
    mode = os.environ.get("POTLUCK_CODEC_BACKEND", "auto")
    if _broken or mode in ("eager", "native"):  # native: the C kernels, and eager where they do not apply
        return "eager"
    if mode == "compile" or n >= COMPILE_MIN_ELEMENTS:
        return "compile"
    return "eager"


def run(name: str, n: int, *args: Any) -> Any:
    """Call quant_core / dequant_core through the backend chosen for n elements (CPU tensors only)."""
    global _broken
    fns: dict[str, Callable[..., Any]] = {"quant": quant_core, "dequant": dequant_core}
    fn = fns[name]
    if _backend(n) == "eager":
        return fn(*args)
    if name not in _compiled:
        # one specialization per (bits, block, rounding, EF) combination; dynamo's default limit of 8
        # would silently drop us back to eager
        import torch._dynamo.config as dcfg  # here, not at the top: importing dynamo costs ~2 s of CPU
        # in every peer and coordinator process, and most never compile (tensors under the threshold)

        dcfg.recompile_limit = max(dcfg.recompile_limit, 64)
        # dynamic=None + marking only the tensors' length dynamic keeps block and bits static:
        # with dynamic=True they become symbols and Inductor's code is ~10x slower
        # fx_graph_cache off: with maybe_mark_dynamic, torch 2.13 served a graph cached for another
        # static length from disk (size assert at run time)
        _compiled[name] = torch.compile(fn, dynamic=None, options={"fx_graph_cache": False})
    for a in args:
        if isinstance(a, torch.Tensor) and a.dim() == 1:
            torch._dynamo.maybe_mark_dynamic(a, 0)
    try:
        return _compiled[name](*args)
    except Exception as exc:  # compiler missing or broken: stay correct, just slower
        _broken = True
        logger.warning("torch.compile of the codec path failed (%s); using eager from now on", exc)
        return fn(*args)
