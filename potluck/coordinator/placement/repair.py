"""Re-planning under churn: repair the previous plan locally, migrate only when it pays.

When peers leave, each empty slot is filled by the spare that costs least there (if there are too few
spares, whole pipelines are retired, fewest first, and their peers become spares). Stage order is kept:
a peer that changes stage must download new weights and optimizer state, so "moved peers" counts stage
changes. A bounded local search may then move more peers, but its gain over `horizon_steps` steps must
exceed the time to move their state (hysteresis), or it is dropped.
"""

from __future__ import annotations

import time

import numpy as np

from potluck.coordinator.placement.bounds import dtfm_combinatorial, step_lower_bound
from potluck.coordinator.placement.costmodel import DtfmJob, StepJob
from potluck.coordinator.placement.objectives import DtfmObjective
from potluck.coordinator.placement.search import Candidate, evaluate_in_order, local_search, try_move
from potluck.coordinator.placement.types import (
    Job,
    PeerId,
    PlacementPlan,
    PlannerConfig,
    PlanningState,
    make_objective,
    to_plan,
)

FILL_CANDIDATES = 48  # spares scored per empty slot


def state_bytes_per_peer(job: Job, n_stages: int) -> float:
    """Bytes a peer must fetch to take over a stage: weights plus optimizer state."""
    if isinstance(job, DtfmJob):
        return job.c_dp_gb * 1e9 * 4.0  # fp32 gradients x (weights, master, 2 Adam moments)
    m = job.model
    return m.params_per_layer * m.layers / n_stages * job.bytes_per_param


def migration_seconds(job: Job, n_stages: int, moved: int, state: PlanningState) -> float:
    """Time to move state to `moved` peers in parallel, at the swarm's median link bandwidth."""
    if moved == 0:
        return 0.0
    off = ~np.eye(state.net.n, dtype=bool)
    bw = float(np.median(state.net.bandwidth_gbps[off])) if state.net.n > 1 else 1.0
    return state_bytes_per_peer(job, n_stages) * 8.0 / (bw * 1e9)


def _stage_of(groups: np.ndarray) -> dict[int, int]:
    return {int(d): j for j, row in enumerate(groups) for d in row}


def _moved(before: dict[int, int], groups: np.ndarray) -> int:
    after = _stage_of(groups)
    return sum(1 for d, j in after.items() if before.get(d) != j)


def repair(
    state: PlanningState, job: Job, previous: PlacementPlan, cfg: PlannerConfig
) -> tuple[PlacementPlan | None, str]:
    deadline = time.monotonic() + cfg.repair_time_limit_s
    rng = np.random.default_rng(cfg.seed)
    index = {p: k for k, p in enumerate(state.peers)}
    grid: list[list[PeerId]] = [list(row) for row in previous.stages]
    placed = {p for row in grid for p in row}
    departed = [p for p in sorted(placed, key=str) if p not in index]
    joined = [p for p in state.peers if p not in placed and p not in previous.spares]
    spares = [index[p] for p in previous.spares if p in index] + [index[p] for p in joined]
    holes = [(j, i) for j, row in enumerate(grid) for i, p in enumerate(row) if p not in index]
    notes = []
    if departed:
        notes.append(f"{len(departed)} left ({', '.join(map(str, departed[:5]))})")
    if joined:
        notes.append(f"{len(joined)} joined")
    # Too few spares: retire the pipelines with the most holes (their survivors become spares).
    n_pipes = len(grid[0])
    retired: list[int] = []

    def available() -> int:
        return len(spares) + sum(1 for row in grid for i in retired if row[i] in index)

    while len(holes) > available():
        counts = {c: sum(1 for _, i in holes if i == c) for c in range(n_pipes) if c not in retired}
        if len(counts) <= 1:
            return None, "; ".join([*notes, "too few peers left to keep a pipeline; plan afresh"])
        col = max(counts, key=lambda c: (counts[c], -c))
        retired.append(col)
        holes = [(j, i) for j, i in holes if i != col]
    if retired:
        spares += [index[row[i]] for row in grid for i in retired if row[i] in index]
        grid = [[p for i, p in enumerate(row) if i not in retired] for row in grid]
        holes = [(j, i) for j, row in enumerate(grid) for i, p in enumerate(row) if p not in index]
        notes.append(f"retired {len(retired)} pipeline(s): not enough spares")
    s, r = len(grid), len(grid[0])
    if isinstance(job, DtfmJob) and r != job.n_replicas:
        job = DtfmJob(job.n_stages, r, job.c_dp_gb, job.c_pp_gb)
    obj = make_objective(state, job, s, r)
    before = {index[p]: j for j, row in enumerate(grid) for p in row if p in index}
    spares_arr = np.array(spares, dtype=np.int64)
    # Provisional fill, then move each hole to the spare that is best there.
    fill = list(spares_arr[: len(holes)])
    groups = np.array([[index.get(p, -1) for p in row] for row in grid], dtype=np.int64)
    for (j, i), d in zip(holes, fill, strict=True):
        groups[j, i] = d
    rest = spares_arr[len(holes) :]
    cand = evaluate_in_order(obj, groups, rest)
    where = np.arange(s)
    for j, i in holes:
        best = None
        # Score only the spares closest (by link weight) to the hole's stage group: a large swarm may
        # have thousands of spares, and far ones lose anyway.
        closeness = obj.link[np.ix_(cand.spares, cand.groups[j])].mean(axis=1)
        for k in np.argsort(closeness, kind="stable")[:FILL_CANDIDATES].tolist():
            cost, new_a, _, stats, edges = try_move(obj, cand, where, j, i, -1, k)
            if best is None or cost < best[0]:
                best = (cost, k, new_a, stats, edges)
        if best is not None and best[0] < cand.cost:
            cost, k, new_a, stats, edges = best
            cand.spares[k] = cand.groups[j][i]
            cand.groups[j] = new_a
            cand.stats, cand.edges, cand.cost = stats, edges, cost
    filled_cost = cand.cost
    moved = _moved(before, cand.groups)
    polished = local_search(obj, _copy(cand), rng, deadline, max_passes=2, move_limit=2000, reorder=False)
    extra = _moved(before, polished.groups) - moved
    gain = (filled_cost - polished.cost) * cfg.horizon_steps
    price = migration_seconds(job, s, extra, state) + max(0, extra) * cfg.move_overhead_s
    if extra >= 0 and gain > price:
        cand, moved = polished, moved + extra
        notes.append(f"moves gain {gain:.1f} s over {cfg.horizon_steps} steps > migration {price:.1f} s")
    elif polished.cost < filled_cost:
        notes.append(f"skipped local moves: gain {gain:.1f} s <= migration {price:.1f} s")
    if isinstance(obj, DtfmObjective):
        everyone = np.sort(np.concatenate([cand.groups.ravel(), cand.spares]))
        lower, method = dtfm_combinatorial(obj, everyone), "combinatorial"
    else:
        lower, method = step_lower_bound(state.devices, job), "perfect-scaling"  # type: ignore[arg-type]
    plan = to_plan(
        obj, cand, state, job, lower, method, "repair", {"moved_peers": moved, "filled_cost": filled_cost}
    )
    notes.append(f"moved {moved} peer(s); cost {previous.cost:.3f} -> {plan.cost:.3f} s")
    return plan, "repair: " + "; ".join(notes)


def _copy(c: Candidate) -> Candidate:
    return Candidate(c.groups.copy(), c.spares.copy(), list(c.stats), list(c.order), c.edges.copy(), c.cost)


__all__ = ["StepJob", "migration_seconds", "repair", "state_bytes_per_peer"]
