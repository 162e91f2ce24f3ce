"""Run by test_triton_kernels.py in a subprocess: prints SHA-256 digests of payloads and decodes for a
set of small cases, so the parent can compare the Triton (interpreter) path with the torch path.
Environment decides the backend: TRITON_INTERPRET=1 POTLUCK_CODEC_BACKEND=triton, or eager."""

from __future__ import annotations

import hashlib
import json

import torch

from potluck.compression import ErrorFeedback, get_codec
from potluck.compression.hashing import stream_seed
from potluck.compression.kernels import dispatch
from potluck.compression.stages.base import StageCtx
from potluck.compression.stages.sparsify import RandKStage

CASES = [
    ("int8:block=64", 4096),
    ("int4:block=32", 1000),
    ("int2:block=128", 3000),
    ("int4:block=64,rounding=stochastic,seed=9", 2048),
    ("int8:block=256,rounding=stochastic", 777),
    ("randk:density=0.1|int8", 5000),
]


def digest(t: torch.Tensor | bytes) -> str:
    data = t if isinstance(t, bytes) else t.contiguous().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def run() -> dict[str, str]:
    out: dict[str, str] = {}
    for i, (spec, n) in enumerate(CASES):
        g = torch.randn(n, generator=torch.Generator().manual_seed(i)) ** 3
        ef = ErrorFeedback()
        codec = get_codec(spec)
        for rnd in range(2):
            data = codec.encode(g, key=(rnd, i), state=ef)
            out[f"{spec}/{n}/{rnd}/payload"] = digest(data)
            assert ef.residual is not None
            out[f"{spec}/{n}/{rnd}/residual"] = digest(ef.residual)
            out[f"{spec}/{n}/{rnd}/decoded"] = digest(codec.decode(data))
            acc = torch.ones(n)
            codec.decode_into(data, acc)
            out[f"{spec}/{n}/{rnd}/accum"] = digest(acc)
    st = RandKStage("randk", {"density": "0.01"})
    for n in (1, 99, 100, 10007):
        pos = st.compute_positions(n, StageCtx(torch.float32, (n,), 12345))
        out[f"randk-positions/{n}"] = digest(pos)
    out["seed"] = str(stream_seed(12345, 0, 2))
    out["backend"] = "triton" if dispatch.use_triton(torch.empty(0)) else "torch"
    return out


if __name__ == "__main__":
    print(json.dumps(run()))
