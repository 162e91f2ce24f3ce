"""Golden codec payloads: fixed inputs, their payloads as written by format version 1, and the cases.

Version-1 payloads were written by the encoder before the one-pass native path and the CRC32C trailer
(format version 2). They must decode forever, to the same values, and a version-2 encoder must write
the same section bytes for the same inputs (only the version byte and the trailer differ).

Regenerate (only when adding a case; existing files must never change):
    PYTHONPATH=. .venv/bin/python tests/unit/compression/golden.py
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import torch

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "codec"
# (name, spec, shape, error-feedback steps before the stored payload; 0 = no error feedback)
CASES: list[tuple[str, str, tuple[int, ...], int]] = [
    ("int8", "int8", (3000,), 0),
    ("int8_b4096_2d", "int8:block=4096", (70, 130), 0),
    ("int4", "int4", (48, 65), 0),
    ("int2_b128", "int2:block=128", (1000,), 0),
    ("int4_stochastic", "int4:rounding=stochastic,seed=7", (2500,), 0),
    ("int2_ef3", "int2", (4100,), 3),
    ("int8_zstd", "int8|zstd", (3000,), 0),
    ("fp16", "fp16", (17, 33), 0),
    ("bf16_zstd", "bf16|zstd", (999,), 0),
    ("topk_int4_zstd", "topk:density=0.1|int4|zstd", (4096,), 0),
    ("randk_int8", "randk:density=0.1|int8", (5000,), 0),
    ("powersgd", "powersgd:rank=2|fp16", (32, 48), 0),
]
KEY = (5, 3, 1)


def inputs(shape: tuple[int, ...], case: int, step: int = 0) -> torch.Tensor:
    """Deterministic heavy-ish tailed values from integer arithmetic only (no RNG whose stream could
    change between torch releases): a Student-like mix of a hash-driven sign, magnitude and outliers."""
    n = math.prod(shape)
    i = np.arange(n, dtype=np.uint64) + np.uint64(1_000_003 * case + 7919 * step)
    h = (i * np.uint64(0x9E3779B97F4A7C15)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    h ^= h >> np.uint64(29)
    u = ((h >> np.uint64(11)) & np.uint64((1 << 24) - 1)).astype(np.float64) / (1 << 24)
    v = np.tan((u - 0.5) * 3.0) * 1e-2  # heavy tails near |u - 0.5| -> 1.5 rad
    return torch.from_numpy(v.astype(np.float32)).reshape(shape)


def payload_for(spec: str, shape: tuple[int, ...], ef_steps: int, case: int, version: int) -> bytes:
    from potluck.compression import ErrorFeedback, get_codec

    codec = get_codec(spec)
    state = ErrorFeedback() if ef_steps else None
    kw = {} if version == 2 else {"version": version}
    for step in range(ef_steps):
        codec.encode(inputs(shape, case, step), key=KEY, state=state, **kw)
    return codec.encode(inputs(shape, case, ef_steps), key=KEY, state=state, **kw)


def main() -> None:
    import inspect

    from potluck.compression import Codec, decode

    version = 1 if "version" in inspect.signature(Codec.encode).parameters else None
    FIXTURES.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for case, (name, spec, shape, ef) in enumerate(CASES):
        path = FIXTURES / f"v1_{name}.bin"
        if not path.exists():
            data = payload_for(spec, shape, ef, case, version or 2)
            assert data[4] == 1, "goldens are version-1 payloads"
            path.write_bytes(data)
        decoded = decode(path.read_bytes()).float().contiguous().numpy().tobytes()
        manifest[name] = {
            "spec": spec,
            "shape": list(shape),
            "ef_steps": ef,
            "case": case,
            "decoded_sha256": hashlib.sha256(decoded).hexdigest(),
        }
    (FIXTURES / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
