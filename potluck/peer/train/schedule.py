"""The 1F1B pipeline schedule (PipeDream-flush): which micro-batch each stage runs forward or backward.

Stage s of S runs min(S - s - 1, M) warm-up forwards, then alternates one forward and one backward,
then drains the remaining backwards. At most S - s micro-batches are in flight on stage s (so
activation memory is bounded by the pipeline depth, not by M), and all stages apply their optimizer
step after the flush, so every step is a synchronous one. Pure.
"""

from __future__ import annotations

from typing import Literal

Op = tuple[Literal["F", "B"], int]


def one_f_one_b(stage: int, n_stages: int, n_micro: int) -> list[Op]:
    if not 0 <= stage < n_stages or n_micro < 1:
        raise ValueError(f"bad schedule request: stage {stage} of {n_stages}, {n_micro} micro-batches")
    warmup = min(n_stages - stage - 1, n_micro)
    ops: list[Op] = [("F", m) for m in range(warmup)]
    next_f, next_b = warmup, 0
    while next_f < n_micro:  # steady state: one forward, then one backward
        ops.append(("F", next_f))
        next_f += 1
        ops.append(("B", next_b))
        next_b += 1
    ops.extend(("B", m) for m in range(next_b, n_micro))  # cool-down
    return ops


def in_flight_peak(ops: list[Op]) -> int:
    """Most micro-batches whose forward ran and backward did not, at any point (activation memory)."""
    live = peak = 0
    for kind, _ in ops:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak
