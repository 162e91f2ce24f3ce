"""Adaptive chooser: the highest-quality codec chain whose transfer fits the time budget.

Pure and deterministic (no I/O, no clocks): the planner and the peers call it with measured numbers.
For a tensor of ``numel`` elements, a role, the link's upload rate and the compute time it must hide
behind, it walks the role's ladder from best to cheapest quality and returns the first chain with

    payload_bytes / link_bytes_per_s + numel * 4 / codec_bytes_per_s  <=  alpha * compute_s

Hysteresis: moving *up* the ladder from ``previous`` needs the stricter ``hysteresis * budget``, so a
link hovering at a threshold does not flip the codec every round. If nothing fits, the chain with the
smallest estimated time is returned with ``fits=False``.
"""

from __future__ import annotations

from dataclasses import dataclass

from potluck.compression.registry import get_codec

# Best quality first. Gradients and pseudo-gradients are sent with error feedback by the caller;
# activations use no error feedback, so they stop at 4 bits (2-bit needs delta coding, see delta.py).
LADDERS: dict[str, tuple[str, ...]] = {
    "gradient": (
        "none",
        "bf16",
        "int8",
        "int8|zstd",
        "int4",
        "int4|zstd",
        "int2|zstd",
        "topk:density=0.1|int4|zstd",
        "topk:density=0.03|int4|zstd",
        "topk:density=0.01|int4|zstd",
        "topk:density=0.003|int4|zstd",
    ),
    "activation": ("none", "bf16", "int8", "int8|zstd", "int4:block=32", "int4:block=32|zstd"),
    "activation_grad": ("none", "bf16", "int8", "int8|zstd", "int4:block=32|zstd"),
}
LADDERS["pseudo_gradient"] = LADDERS["gradient"]

# Encode + decode throughput in bytes of fp32 input per second, per stage, on a 2-core CPU with the
# compiled path (order of magnitude, from scripts/bench_codecs.py); callers with a GPU pass their own.
DEFAULT_CODEC_RATES: dict[str, float] = {
    "none": 20e9,
    "fp32": 20e9,
    "bf16": 2e9,
    "fp16": 1e9,
    "int8": 2e9,
    "int4": 2e9,
    "int2": 2e9,
    "topk": 0.5e9,
    "randk": 1e9,
    "powersgd": 0.3e9,
    # bytes of the stage's input (the payload) per second, shuffle included; scripts/bench_codecs.py
    # measured ~0.2 GB/s compressing int4 payloads on 2 contended cores, ~1 GB/s when quiet
    "zstd": 0.3e9,
}


@dataclass(frozen=True)
class Choice:
    spec: str
    payload_bytes: int
    seconds: float
    fits: bool


def _stage_names(spec: str) -> list[str]:
    return [part.split(":", 1)[0].strip() for part in spec.split("|")]


def estimate_seconds(
    spec: str, numel: int, link_bytes_per_s: float, rates: dict[str, float] | None = None
) -> tuple[int, float]:
    """(payload bytes, transfer + coding seconds) for one tensor."""
    rates = rates or DEFAULT_CODEC_RATES
    codec = get_codec(spec)
    payload = codec.estimate_bytes((numel,))
    coding = 0.0
    for name in _stage_names(spec):
        if name == "zstd":
            raw = payload * codec.lossless.expected_ratio if codec.lossless is not None else payload
            coding += 2 * raw / rates["zstd"]
        else:
            coding += 4 * numel / rates.get(name, 1e9)
    return payload, payload / link_bytes_per_s + coding


def choose(
    numel: int,
    role: str,
    link_bytes_per_s: float,
    compute_s: float,
    *,
    alpha: float = 1.0,
    previous: str | None = None,
    hysteresis: float = 0.8,
    rates: dict[str, float] | None = None,
    ladder: tuple[str, ...] | None = None,
) -> Choice:
    """The chain to use for the next transfer of a tensor of ``numel`` elements."""
    if link_bytes_per_s <= 0 or compute_s < 0 or numel < 0:
        raise ValueError("link rate must be > 0, compute time and numel >= 0")
    steps = ladder if ladder is not None else LADDERS.get(role)
    if steps is None:
        raise ValueError(f"unknown tensor role {role!r}; known: {sorted(LADDERS)}")
    budget = alpha * compute_s
    prev_rank = steps.index(previous) if previous in steps else None
    best: Choice | None = None
    for rank, spec in enumerate(steps):
        size, secs = estimate_seconds(spec, numel, link_bytes_per_s, rates)
        limit = budget * hysteresis if prev_rank is not None and rank < prev_rank else budget
        if secs <= limit:
            return Choice(spec, size, secs, True)
        if best is None or secs < best.seconds:
            best = Choice(spec, size, secs, False)
    assert best is not None
    return best
