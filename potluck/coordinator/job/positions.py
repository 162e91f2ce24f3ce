"""Keeping a bottleneck job's cuts on its positions (``TrainPlan.bottlenecks``) when that is faster. Pure.

The positions are fixed by the first plan (model/bottleneck.py); later plans may cut anywhere, and a
cut off the positions carries d_model-wide hidden states instead of rank-wide codes (d/r times the
bytes: 8x at rank 16 of 128). The placement search balances layers by the peers' speeds and prices
every cut at the rank, so it cannot see that. Here, for a plan of S stages, every split that cuts only
at positions (S - 1 of them, in order) is priced against the searched split with each cut at the width
it will carry (``predict_step(..., positions=...)``), and the fastest split that fits every stage's
memory is kept. On fast links the searched split usually wins (compute balance); on slow ones the
positions do.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np

from potluck.coordinator.placement.costmodel import StepJob, memory_caps, micro_batches
from potluck.protocol.training import TrainPlan, stage_run_ahead

MAX_SPLITS = 256  # position splits priced at most (each is one step-model evaluation, ~1 ms)


def position_splits(positions: Sequence[int], stages: int) -> list[tuple[int, ...]]:
    """Cut points of every split into ``stages`` stages that cuts only at ``positions`` (first
    ``MAX_SPLITS`` in lexicographic order); none when there are fewer positions than cuts."""
    return list(itertools.islice(itertools.combinations(sorted(set(positions)), stages - 1), MAX_SPLITS))


def resplit(plan: TrainPlan, cuts: Sequence[int]) -> TrainPlan:
    """``plan`` with the same peers per stage, its layers cut at ``cuts`` instead."""
    edges = [0, *cuts, plan.n_layers]
    stages = [
        st.model_copy(update={"first_layer": a, "last_layer": b})
        for st, (a, b) in zip(plan.stages, itertools.pairwise(edges), strict=True)
    ]
    return plan.model_copy(update={"stages": stages})


def fits_memory(plan: TrainPlan, sj: StepJob, memory_gb: Sequence[float]) -> bool:
    """Whether every stage's layers, with the micro-batches it keeps in flight, fit the smallest free
    memory among its peers (``memory_gb``, per stage), by the planner's own rule (``memory_caps``)."""
    s = len(plan.stages)
    ahead = np.array(stage_run_ahead(s, plan.run_ahead))
    in_flight = np.minimum(micro_batches(sj, plan.data_replicas), s - np.arange(s)) + ahead
    layers = np.array([st.last_layer - st.first_layer for st in plan.stages])
    return bool((layers <= memory_caps(sj, np.asarray(memory_gb, dtype=float), in_flight)).all())


def keep_positions(
    plan: TrainPlan,
    positions: Sequence[int],
    sj: StepJob,
    memory_gb: Sequence[float],
    predict: Callable[[TrainPlan], float],
) -> tuple[TrainPlan, str]:
    """(the plan cut where it predicts fastest: its own split or one at the positions, the note for
    the plan's reason). ``predict``: seconds per step of a plan, each cut priced at the width it
    carries; ``memory_gb``: per stage, the smallest free memory of its peers."""
    if set(plan.cuts) <= set(positions):
        return plan, ""
    splits = position_splits(positions, len(plan.stages))
    if not splits:
        n = len(positions)
        return plan, f"; {len(plan.stages)} stages on {n} bottleneck position(s): some cut carries full width"
    own = predict(plan)
    best, best_s = plan, own
    for cuts in splits:
        cand = resplit(plan, cuts)
        if not fits_memory(cand, sj, memory_gb):
            continue
        s = predict(cand)
        if s < best_s and np.isfinite(s):
            best, best_s = cand, s
    if best is plan:
        return plan, f"; cut off the bottleneck positions {list(positions)} (faster: {own:.3f} s a step)"
    return best, f"; cut at the bottleneck positions {list(best.cuts)}: {best_s:.3f} s a step, not {own:.3f}"
