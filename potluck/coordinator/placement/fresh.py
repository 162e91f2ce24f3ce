"""Fresh search: a placement from scratch, with no previous plan to respect.

For the step objective it screens shapes (stages x replicas, leaving the slowest peers out as spares),
builds structured templates for the best shapes, improves the best by local search on the true
objective and then runs the genetic algorithm with the remaining time. For the DT-FM objective the
shape is given and the lower bound is computed first, so the search can stop once it reaches it.
Pure: the same inputs and seed give the same plan (the wall-clock limit only cuts the search short).
"""

from __future__ import annotations

import math
import time

import numpy as np

from potluck.coordinator.placement.bounds import dtfm_lower_bound, step_lower_bound
from potluck.coordinator.placement.costmodel import DeviceSpec, DtfmJob, StepJob
from potluck.coordinator.placement.objectives import DtfmObjective, Objective
from potluck.coordinator.placement.search import (
    SEARCH_EXACT_LIMIT,
    evaluate,
    genetic_search,
    local_search,
)
from potluck.coordinator.placement.templates import cluster_levels, template_partitions
from potluck.coordinator.placement.types import (
    Job,
    PlacementPlan,
    PlannerConfig,
    PlanningState,
    SearchResult,
    make_objective,
    to_plan,
)

SCREEN_EXACT_LIMIT = 8  # stages up to which shape screening orders stages exactly (Held-Karp)


def _search(
    obj: Objective,
    active: np.ndarray,
    spares: np.ndarray,
    rng: np.random.Generator,
    deadline: float,
    cfg: PlannerConfig,
    clustering: tuple[np.ndarray, list] | None = None,
    target: float = 0.0,
) -> SearchResult:
    """Templates -> local search on the best -> GA (stops early on reaching `target`, a lower bound)."""
    start = time.monotonic()
    seeds = template_partitions(obj.link, active, obj.n_stages, obj.n_replicas, clustering)
    pool = np.union1d(active, spares)  # templates may leave some active peers out: they become spares
    scored = [
        (name, evaluate(obj, groups, np.setdiff1d(pool, groups), SEARCH_EXACT_LIMIT))
        for name, groups in seeds
    ]
    scored.sort(key=lambda x: x[1].cost)
    name, best = scored[0]
    if best.cost <= target * (1 + 1e-9):
        return SearchResult(best, name, 0, time.monotonic() - start)  # proven optimal
    ls_deadline = min(deadline, start + 0.4 * max(deadline - start, 0.0))
    best = local_search(obj, best, rng, ls_deadline, move_limit=cfg.ls_move_limit)
    found = time.monotonic() - start
    population = [best] + [c for _, c in scored[1:]]
    ga_best, gens, ga_found = genetic_search(obj, population, rng, deadline, cfg.ga, target)
    if ga_best.cost < best.cost * (1 - 1e-9):
        best, name, found = ga_best, f"{name}+ga", ga_found - start
    if obj.n_stages > SEARCH_EXACT_LIMIT:  # the search ordered big pipelines heuristically: finish exactly
        exact = evaluate(obj, best.groups, best.spares)
        if exact.cost < best.cost:
            best = exact
    return SearchResult(best, name, gens, found)


def _shapes(n: int, job: StepJob, cfg: PlannerConfig) -> list[tuple[int, int]]:
    grid = sorted({1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128})
    if cfg.stages is not None:
        grid = [cfg.stages]
    out = []
    for s in grid:
        if s > min(job.model.layers, n, cfg.max_stages):
            continue
        r_max = min(n // s, cfg.max_replicas)
        options = {r_max, math.ceil(r_max * 0.75), math.ceil(r_max * 0.5), math.ceil(r_max * 0.25), 1}
        if cfg.replicas is not None:
            options = {cfg.replicas} if cfg.replicas <= r_max else set()
        for r in sorted(options, reverse=True):
            if r >= 1:
                out.append((s, r))
    return out


def _by_speed(devices: tuple[DeviceSpec, ...]) -> np.ndarray:
    """Device indices, fastest first (memory breaks ties): the ones kept when some become spares."""
    return np.array(
        sorted(range(len(devices)), key=lambda k: (-devices[k].tflops, -devices[k].memory_gb, k)),
        dtype=np.int64,
    )


def _rankings(devices: tuple[DeviceSpec, ...], clustering: tuple[np.ndarray, list]) -> dict[str, np.ndarray]:
    """Orders in which peers are taken into a shape (the rest become spares).

    "fast": fastest first. "site": whole clusters first (the cluster with the most TFLOP/s, then the
    next), fastest first inside each, so small shapes can stay inside one well-connected site.
    """
    out = {"fast": _by_speed(devices)}
    speed = np.array([d.tflops for d in devices])
    for level, clusters in enumerate(clustering[1][:2]):
        if len(clusters) < 2:
            continue
        ordered = sorted(clusters, key=lambda c: (-float(speed[c].sum()), c[0]))
        out[f"site{level}"] = np.array(
            [d for c in ordered for d in sorted(c, key=lambda k: (-speed[k], k))], dtype=np.int64
        )
    return out


def fresh_plan(state: PlanningState, job: Job, cfg: PlannerConfig) -> tuple[PlacementPlan | None, str]:
    rng = np.random.default_rng(cfg.seed)
    start = time.monotonic()
    deadline = start + cfg.time_limit_s
    n = len(state.peers)
    everyone = np.arange(n, dtype=np.int64)
    if isinstance(job, DtfmJob):
        need = job.n_stages * job.n_replicas
        if n < need:
            return None, f"need {need} peers for {job.n_stages} x {job.n_replicas}, have {n}"
        obj = make_objective(state, job, job.n_stages, job.n_replicas)
        assert isinstance(obj, DtfmObjective)
        # Bound first: it can end the search early, and the search gets what is left of the limit.
        lower, method = dtfm_lower_bound(obj, everyone, min(cfg.bound_time_limit_s, cfg.time_limit_s / 2))
        deadline = start + 0.97 * cfg.time_limit_s
        spares = np.array([], dtype=np.int64)
        res = _search(obj, everyone, spares, rng, deadline, cfg, target=lower)
        detail = {"generations": res.generations, "seconds_to_best": res.seconds_to_best}
        plan = to_plan(obj, res.best, state, job, lower, method, res.template, detail)
        template = res.template
        return plan, f"fresh plan: {job.n_stages} stages x {job.n_replicas} replicas from {template}"
    # Cluster once on a shape-independent link weight; every shape's templates reuse it.
    clustering = cluster_levels(make_objective(state, job, 1, 1).link, everyone)
    rankings = _rankings(state.devices, clustering)
    screened: list[tuple[float, int, int, str]] = []
    for s, r in _shapes(n, job, cfg):
        obj = make_objective(state, job, s, r)
        for rank_name, ranked in rankings.items():
            active, spares = np.sort(ranked[: s * r]), np.sort(ranked[s * r :])
            costs = [
                evaluate(obj, groups, spares, exact_limit=SCREEN_EXACT_LIMIT).cost
                for _, groups in template_partitions(obj.link, active, s, r, clustering)[:2]
            ]
            if math.isfinite(min(costs)):
                screened.append((min(costs), s, r, rank_name))
    if not screened:
        if not _shapes(n, job, cfg):
            return None, f"no shape within the job's limits fits {n} peers"
        return None, "no feasible shape: the model does not fit in the peers' memory"
    screened.sort()
    best: tuple[SearchResult, Objective, str] | None = None
    picks = screened[: cfg.max_shapes]
    for k, (_, s, r, rank_name) in enumerate(picks):
        share = (deadline - time.monotonic()) / (len(picks) - k)
        obj = make_objective(state, job, s, r)
        ranked = rankings[rank_name]
        active, spares = np.sort(ranked[: s * r]), np.sort(ranked[s * r :])
        res = _search(obj, active, spares, rng, time.monotonic() + share, cfg, clustering)
        if best is None or res.best.cost < best[0].best.cost:
            best = (res, obj, f"{s}x{r} {rank_name} {res.template}")
    assert best is not None
    res, obj, template = best
    lower = step_lower_bound(state.devices, job)
    detail = {
        "generations": res.generations,
        "shapes_screened": len(screened),
        "seconds_to_best": res.seconds_to_best,
    }
    plan = to_plan(obj, res.best, state, job, lower, "perfect-scaling", template, detail)
    return (
        plan,
        f"fresh plan: {plan.n_stages} stages x {plan.n_replicas} replicas, "
        f"{len(plan.spares)} spares, from {template}",
    )
