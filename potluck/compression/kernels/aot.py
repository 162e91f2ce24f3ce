"""The codec's Triton kernels compiled for real GPUs ahead of time, on a machine without one.

``TRITON_INTERPRET=1`` runs the kernels on CPU tensors, which checks their arithmetic but not that they
compile: the interpreter accepts Python a GPU build refuses (a kernel reading a plain module global,
say). Triton compiles for an explicit target without a device, with the ptxas it ships, so every
kernel variant the codecs launch is built here for sm_80 (A100) and sm_90 (H100), and its cubin's
resource usage (registers, shared memory, spills) read back with the bundled ``cuobjdump``. From those
come the occupancy each kernel can reach, and from the bytes each moves per element, a roofline time
at the GPU's memory bandwidth (the kernels are memory-bound: a few integer ops per byte).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from potluck.compression.kernels import triton_kernels as tk

TARGETS = (80, 90)
# Per SM, both generations: 64K 32-bit registers, 64 resident warps, 32 resident blocks; shared memory
# 164 KiB (A100) / 228 KiB (H100); HBM 2.04 TB/s (A100 80 GB) / 3.35 TB/s (H100 SXM).
REGS_PER_SM, MAX_WARPS, MAX_BLOCKS = 65536, 64, 32
SHARED_PER_SM = {80: 164 << 10, 90: 228 << 10}
HBM_BYTES_S = {80: 2.04e12, 90: 3.35e12}
BLOCK = 64  # the codecs' default quantisation block (int8:block=64)


@dataclass(frozen=True)
class Variant:
    """One specialisation the codecs launch: a kernel, its argument types and its constexprs."""

    name: str
    fn: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    bytes_per_element: float  # global memory read + written per element it handles


@dataclass(frozen=True)
class KernelReport:
    name: str
    cc: int
    num_warps: int
    registers: int
    shared_bytes: int
    spill_bytes: int  # local memory per thread (0: no spills)
    occupancy: float  # resident warps / 64, limited by registers, shared memory and blocks
    roofline_us_16m: float  # time for 2^24 elements at the GPU's HBM bandwidth, microseconds
    compile_s: float


def variants(block: int = BLOCK) -> list[Variant]:
    rows = tk._rows(block)
    out: list[Variant] = []
    for bits in (8, 4, 2):
        code = bits / 8 + 2 / block  # packed codes plus a 2-byte scale per block
        for label, has_e, want_r, stochastic in (
            ("plain", False, False, False),
            ("feedback", True, True, False),
            ("feedback+stochastic", True, True, True),
        ):
            fp = "*fp32"
            sig = {
                "g_ptr": fp,
                "e_ptr": fp if has_e else "*i16",  # an unused pointer gets the scale buffer
                "r_ptr": fp if want_r else "*i16",
                "code_ptr": "*u8",
                "scale_ptr": "*i16",
                "nblocks": "i32",
                "seed_lo": "i32",
                "seed_hi": "i32",
                "start": "i32",
            }
            const = dict(BLOCK=block, BITS=bits, ROWS=rows, HAS_E=has_e, WANT_R=want_r, STOCHASTIC=stochastic)
            moved = 4 + code + (4 if has_e else 0) + (4 if want_r else 0)
            out.append(Variant(f"quantize int{bits} {label}", tk._quant_kernel, sig, const, moved))
        for accum in (False, True):
            sig = {"code_ptr": "*u8", "scale_ptr": "*i16", "out_ptr": "*fp32", "nblocks": "i32"}
            const = dict(BLOCK=block, BITS=bits, ROWS=rows, ACCUM=accum)
            moved = code + 4 + (4 if accum else 0)
            label = "dequantize+accumulate" if accum else "dequantize"
            out.append(Variant(f"{label} int{bits}", tk._dequant_kernel, sig, const, moved))
    randk_sig = {
        "x_ptr": "*fp32",
        "out_ptr": "*fp32",
        "pos_ptr": "*i64",
        "vals_ptr": "*fp32",
        "n": "i64",
        "k": "i64",
        "stride": "i64",
        "seed_lo": "i32",
        "seed_hi": "i32",
    }
    # per selected element: positions store 8 bytes; a gather reads 4 (scattered) and writes 4; a
    # scatter-add reads 4 + 4 and writes 4
    for mode, label, moved in (
        (0, "random-k positions", 8.0),
        (1, "random-k gather", 8.0),
        (2, "random-k scatter-add", 12.0),
    ):
        const = dict(TILE=1024, MODE=mode)
        out.append(Variant(label, tk._randk_kernel, randk_sig, const, moved))
    return out


def compile_variant(v: Variant, cc: int) -> Any:
    src = ASTSource(
        fn=v.fn,
        signature={**v.signature, **dict.fromkeys(v.constexprs, "constexpr")},
        constexprs=v.constexprs,
    )
    return triton.compile(src, target=GPUTarget("cuda", cc, 32))


def _tool(name: str) -> Path:
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def resource_usage(cubin: bytes) -> dict[str, int]:
    """REG, SHARED, LOCAL, ... of the cubin's one function, as ``cuobjdump -res-usage`` prints them."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(
            [str(_tool("cuobjdump")), "-res-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    return {k: int(v) for k, v in re.findall(r"\b([A-Z]+(?:\[\d+\])?):(\d+)", out)}


def occupancy(cc: int, registers: int, shared_bytes: int, num_warps: int) -> float:
    """Resident warps per SM / 64 (registers allocated per warp in units of 256)."""
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_regs = REGS_PER_SM // (per_warp * num_warps)
    by_shared = SHARED_PER_SM[cc] // shared_bytes if shared_bytes else MAX_BLOCKS
    blocks = min(by_regs, by_shared, MAX_BLOCKS, MAX_WARPS // num_warps)
    return blocks * num_warps / MAX_WARPS


def report(v: Variant, cc: int, elements: int = 1 << 24) -> KernelReport:
    start = time.perf_counter()
    kernel = compile_variant(v, cc)
    took = time.perf_counter() - start
    use = resource_usage(kernel.asm["cubin"])
    warps = int(kernel.metadata.num_warps)
    shared = max(use.get("SHARED", 0), int(kernel.metadata.shared))
    regs = use.get("REG", 0)
    return KernelReport(
        name=v.name,
        cc=cc,
        num_warps=warps,
        registers=regs,
        shared_bytes=shared,
        spill_bytes=use.get("LOCAL", 0),
        occupancy=occupancy(cc, regs, shared, warps),
        roofline_us_16m=v.bytes_per_element * elements / HBM_BYTES_S[cc] * 1e6,
        compile_s=took,
    )
