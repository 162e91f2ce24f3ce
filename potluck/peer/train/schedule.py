"""The 1F1B pipeline schedule (PipeDream-flush): which micro-batch each stage runs forward or backward.

Stage s of S runs min(S - s - 1, M) warm-up forwards, then alternates one forward and one backward,
then drains the remaining backwards. At most S - s micro-batches are in flight on stage s (so
activation memory is bounded by the pipeline depth, not by M), and all stages apply their optimizer
step after the flush, so every step is a synchronous one. Pure.
"""

from __future__ import annotations

from typing import Literal

from potluck.protocol.training import stage_run_ahead

Op = tuple[Literal["F", "B"], int]


def warmups(n_stages: int, run_ahead: int = 0) -> list[int]:
    """Warm-up forwards per stage before its first backward. 1F1B's S - s - 1, plus ``run_ahead`` (the
    plan's) on every stage but the last: on a link whose round trip is long next to a micro-batch's
    compute, a stage that waits for each backward before its next forward idles for the round trip;
    with k more micro-batches in flight it keeps computing while activations and their gradients are
    on the wire. The last stage has no round trip to cover: a forward it runs ahead only holds back the
    gradient its upstream waits for, so it runs each backward right after its forward, and the two
    directions of a slow link carry activations and gradients at once instead of one after the other
    (on the home testbed, with 15 ahead, the last stage ran 15 forwards before its first backward).
    Warm-ups never increase along the pipeline, which keeps the schedule deadlock free."""
    return [n_stages - s - 1 + k for s, k in enumerate(stage_run_ahead(n_stages, run_ahead))]


def one_f_one_b(stage: int, n_stages: int, n_micro: int, run_ahead: int = 0) -> list[Op]:
    """Stage ``stage``'s ops, with ``warmups`` forwards before its first backward; activation memory
    grows by ``run_ahead`` micro-batches on every stage but the last."""
    if not 0 <= stage < n_stages or n_micro < 1 or run_ahead < 0:
        raise ValueError(
            f"bad schedule request: stage {stage} of {n_stages}, {n_micro} micro-batches, "
            f"run-ahead {run_ahead}"
        )
    warmup = min(warmups(n_stages, run_ahead)[stage], n_micro)
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
