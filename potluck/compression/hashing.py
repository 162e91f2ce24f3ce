"""Counter-based hashing for shared random streams: identical bits in torch (CPU/GPU) and Triton.

We never use ``torch.Generator``: PyTorch documents no reproducibility of its streams across releases,
platforms or CPU vs GPU. Instead every random number is a pure function of (seed, element index):

    seed64   = splitmix64 chain over the key parts and the codec's own seed (host side, Python ints)
    h(i)     = fmix32(((i ^ seed_lo) * 0x9E3779B1 + seed_hi) mod 2^32)     (device side, uint32 math)
    uniform  = (h >> 8) * 2^-24, exactly representable in fp32, in [0, 1)

``fmix32`` is MurmurHash3's finalizer. For a fixed seed, h is a bijection of i < 2^32. Not cryptographic.
The torch version works in int64 and masks to 32 bits after each multiply (int64 multiply wraps).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF
GOLDEN32 = 0x9E3779B1
FMIX_C1 = 0x85EBCA6B
FMIX_C2 = 0xC2B2AE35
KeyLike = int | Sequence[int] | None


def splitmix64(x: int) -> int:
    """One splitmix64 step on a Python int (mod 2^64)."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def key_to_u64(key: KeyLike) -> int | None:
    """Fold a key (an int, or a tuple such as (round, tensor_id, part)) into one u64."""
    if key is None:
        return None
    if isinstance(key, int):
        if key < 0:
            raise ValueError(f"key must be non-negative, got {key}")
        return key & M64 if key <= M64 else splitmix64(key & M64)
    acc = 0x243F6A8885A308D3  # arbitrary non-zero start (pi digits)
    for part in key:
        if not isinstance(part, int) or part < 0:
            raise ValueError(f"key parts must be non-negative ints, got {part!r}")
        acc = splitmix64(acc ^ (part & M64))
    return acc


def stream_seed(key64: int, stage_seed: int, salt: int) -> tuple[int, int]:
    """The two 32-bit halves of the seed of one random stream (salt separates streams of one key)."""
    s = splitmix64(splitmix64(key64 ^ (salt * 0xD1B54A32D192ED03 & M64)) ^ (stage_seed & M64))
    return s & M32, (s >> 32) & M32


def fmix32_torch(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3 fmix32 on int64 tensors holding values in [0, 2^32)."""
    h = h ^ (h >> 16)
    h = (h * FMIX_C1) & M32
    h = h ^ (h >> 13)
    h = (h * FMIX_C2) & M32
    return h ^ (h >> 16)


def hash_indices(idx: torch.Tensor, seed: tuple[int, int]) -> torch.Tensor:
    """h(i) for int64 indices in [0, 2^32); returns int64 values in [0, 2^32)."""
    lo, hi = seed
    h = ((idx ^ lo) * GOLDEN32 + hi) & M32
    return fmix32_torch(h)


def uniform(
    n: int, seed: tuple[int, int], start: int = 0, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """n fp32 uniforms in [0, 1) for element indices start..start+n-1 (24-bit resolution)."""
    idx = torch.arange(start, start + n, dtype=torch.int64, device=device)
    return (hash_indices(idx, seed) >> 8).to(torch.float32) * (2.0**-24)
