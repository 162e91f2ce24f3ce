"""Tensor-level calls into the native kernels: quantize(+feedback)+pack+CRC32C, unpack+dequantize(+add).

Callers check ``usable(...)`` first; everything here assumes fp32, contiguous CPU tensors and a loaded
library. Buffers are passed as addresses, so the encoder can write straight into a payload.
"""

from __future__ import annotations

import ctypes
import math

import torch

from potluck.compression.kernels import native

Seed = tuple[int, int] | None


def usable(*tensors: torch.Tensor | None) -> bool:
    """Whether the native path applies: the library loaded and every tensor fp32, contiguous, on CPU."""
    if native.lib() is None:
        return False
    return all(
        t is None or (t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous())
        for t in tensors
    )


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else int(t.data_ptr())


def quantize_to(
    x: torch.Tensor,
    e: torch.Tensor | None,
    resid: torch.Tensor | None,
    block: int,
    bits: int,
    seed: Seed,
    scales_addr: int,
    codes_addr: int,
    start: int = 0,
) -> tuple[bool, list[tuple[int, int, int, int]]]:
    """Quantize all of x (+ e) into the buffers at ``scales_addr`` / ``codes_addr`` and the residual
    into ``resid`` (may be e). Returns (all finite, per thread part: (crc of its scale bytes, their
    length, crc of its code bytes, their length)), the parts in order."""
    lib = native.lib()
    assert lib is not None
    n = x.numel()
    nb = math.ceil(n / block)
    lo, hi = seed if seed is not None else (0, 0)
    run = block * bits // 8
    gp, ep, rp = _ptr(x), _ptr(e), _ptr(resid)

    def part(b0: int, b1: int) -> tuple[int, int, int, int, int]:
        crcs = (ctypes.c_uint32 * 2)()
        rc = lib.plk_quantize(
            gp, ep, rp, n, b0, b1, block, bits, int(seed is not None), lo, hi, start,
            int(resid is not None), scales_addr, codes_addr, ctypes.addressof(crcs),
        )  # fmt: skip
        if rc < 0:
            raise ValueError(f"native quantize rejected its arguments (n={n}, block={block}, bits={bits})")
        return rc, int(crcs[0]), 2 * (b1 - b0), int(crcs[1]), run * (b1 - b0)

    results = native.parallel(nb, native.threads_for(n), part)
    return all(r[0] == 1 for r in results), [r[1:] for r in results]


def quantize(
    x: torch.Tensor, e: torch.Tensor | None, resid: torch.Tensor | None, block: int, bits: int, seed: Seed
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(scale bits int16 [nblocks], packed uint8, all finite) in fresh tensors."""
    nb = math.ceil(x.numel() / block)
    sbits = torch.empty(nb, dtype=torch.int16)
    packed = torch.empty(nb * block * bits // 8, dtype=torch.uint8)
    finite, _ = quantize_to(x, e, resid, block, bits, seed, sbits.data_ptr(), packed.data_ptr())
    return sbits, packed, finite


def dequantize_to(
    codes_addr: int, scales_addr: int, n: int, block: int, bits: int, out: torch.Tensor, accumulate: bool
) -> None:
    """Values of n elements into ``out`` (fp32, n elements), added to it when ``accumulate``."""
    lib = native.lib()
    assert lib is not None and out.numel() == n
    op = out.data_ptr()

    def part(b0: int, b1: int) -> int:
        return int(lib.plk_dequantize(codes_addr, scales_addr, n, b0, b1, block, bits, op, int(accumulate)))

    if any(rc < 0 for rc in native.parallel(math.ceil(n / block), native.threads_for(n), part)):
        raise ValueError(f"native dequantize rejected its arguments (n={n}, block={block}, bits={bits})")
