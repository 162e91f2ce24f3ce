"""Chooses the implementation of the dense quantize / dequantize and random-k position paths.

CUDA tensors use the Triton kernels when Triton is installed; CPU tensors use kernels.cpu (eager or
torch.compile). ``POTLUCK_CODEC_BACKEND=triton`` forces Triton for CPU tensors too, which only works
under ``TRITON_INTERPRET=1`` and exists so tests can compare the kernels' bytes with the torch path.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from typing import Any

import torch

from potluck.compression.kernels import cpu


@lru_cache(maxsize=1)
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_triton(t: torch.Tensor) -> bool:
    if not triton_available():
        return False
    return t.device.type == "cuda" or os.environ.get("POTLUCK_CODEC_BACKEND") == "triton"


def quantize(
    g: torch.Tensor,
    e: torch.Tensor | None,
    block: int,
    bits: int,
    seed: tuple[int, int] | None,
    want_resid: bool,
    start: int = 0,
    resid_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, Any]:
    """(scale bits, packed, residual, all-finite flag) for whole blocks of g (+ e)."""
    if use_triton(g):
        from potluck.compression.kernels import triton_kernels as tk

        sb, pk, rs = tk.quantize_pack(g, e, block, bits, seed, want_resid, start, resid_out)
        x = g if e is None else g.float() + e.float()
        return sb, pk, rs, torch.isfinite(x.float().abs().amax()) if g.numel() else True
    lo, hi = seed if seed is not None else (0, 0)
    return cpu.run(
        "quant", g.numel(), g, e, block, bits, lo, hi, seed is not None, want_resid, start, resid_out
    )


def dequantize(packed: torch.Tensor, sbits: torch.Tensor, block: int, bits: int) -> torch.Tensor:
    if use_triton(packed):
        from potluck.compression.kernels import triton_kernels as tk

        return tk.dequantize(packed, sbits, block, bits)
    return cpu.run("dequant", sbits.numel() * block, packed, sbits, block, bits, None)


def randk_positions(n: int, stride: int, seed: tuple[int, int], device: torch.device) -> torch.Tensor | None:
    """Positions from the Triton kernel where it applies, else None (the caller uses torch)."""
    probe = torch.empty(0, device=device)
    if not use_triton(probe):
        return None
    from potluck.compression.kernels import triton_kernels as tk

    return tk.randk_positions(n, stride, seed, device)
