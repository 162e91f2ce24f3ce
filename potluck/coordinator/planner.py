"""The planner: `plan(state, job, now, previous, cfg) -> (PlacementPlan | None, reason)`.

Pure: no I/O; the same inputs and seed give the same plan (the wall-clock limit only cuts the search
short on slow machines). With no previous plan it searches from scratch: for the step objective it
screens shapes (stages x replicas, leaving the slowest peers out as spares), builds structured templates
for the best shapes, improves the best by local search on the true objective and then runs the genetic
algorithm with the remaining time. With a previous plan it repairs (see replan.py).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from potluck.coordinator.bounds import dtfm_lower_bound, step_lower_bound
from potluck.coordinator.costmodel import DeviceSpec, DtfmJob, StepJob
from potluck.coordinator.errors import PlanningError
from potluck.coordinator.netmodel import NetModel
from potluck.coordinator.objectives import DtfmObjective, Objective, StepObjective
from potluck.coordinator.search import (
    SEARCH_EXACT_LIMIT,
    Candidate,
    GaConfig,
    evaluate,
    genetic_search,
    local_search,
    pipelines,
)
from potluck.coordinator.templates import cluster_levels, template_partitions

logger = logging.getLogger(__name__)

PeerId = str | int
SCREEN_EXACT_LIMIT = 8  # stages up to which shape screening orders stages exactly (Held-Karp)
Job = DtfmJob | StepJob


@dataclass(frozen=True)
class PlanningState:
    """What the planner sees of the swarm: peers, their hardware, and the link model (same order)."""

    peers: tuple[PeerId, ...]
    devices: tuple[DeviceSpec, ...]
    net: NetModel

    def __post_init__(self) -> None:
        if not (len(self.peers) == len(self.devices) == self.net.n):
            raise PlanningError(
                f"state is inconsistent: {len(self.peers)} peers, {len(self.devices)} devices, "
                f"{self.net.n} in the link model"
            )


@dataclass(frozen=True)
class PlannerConfig:
    seed: int = 0
    time_limit_s: float = 5.0  # whole search; the bound has its own limit
    bound_time_limit_s: float = 2.0
    ga: GaConfig = field(default_factory=GaConfig)
    ls_move_limit: int = 4000  # moves per local-search pass before it samples around the worst groups
    max_shapes: int = 3  # (shape, peer ranking) pairs carried from screening into the search
    horizon_steps: int = 200  # re-planning: steps over which a better plan must repay migration
    repair_time_limit_s: float = 0.6  # local moves after the fill; the fill itself is not limited
    # Shape limits (the job's [limits]): a forced depth/width, or caps on them.
    stages: int | None = None
    replicas: int | None = None
    max_stages: int = 1 << 20
    max_replicas: int = 1 << 20


@dataclass(frozen=True)
class PlacementPlan:
    """The planner's answer. stages[j][i] is the peer running stage j of pipeline i."""

    objective: str
    stages: tuple[tuple[PeerId, ...], ...]
    spares: tuple[PeerId, ...]
    cost: float  # seconds (DT-FM COMM-COST, or predicted step time)
    lower_bound: float
    bound_method: str
    layers: tuple[int, ...] = ()  # layers per stage, pipeline order (step objective)
    micro_batches: int = 0
    template: str = ""  # which structured start the winner descends from
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float:
        """Relative distance to the lower bound: the plan is at most this far from optimal."""
        return self.cost / self.lower_bound - 1.0 if self.lower_bound > 0 else math.inf

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    @property
    def n_replicas(self) -> int:
        return len(self.stages[0]) if self.stages else 0


def make_objective(state: PlanningState, job: Job, n_stages: int, n_replicas: int) -> Objective:
    if isinstance(job, DtfmJob):
        return DtfmObjective(state.net, job)
    return StepObjective(state.net, state.devices, job, n_stages, n_replicas)


@dataclass
class SearchResult:
    best: Candidate
    template: str  # the structured start it descends from (+ga if the GA beat the descent)
    generations: int
    seconds_to_best: float  # from the start of this search until the final best was found


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


def to_plan(
    obj: Objective,
    cand: Candidate,
    state: PlanningState,
    job: Job,
    lower: float,
    method: str,
    template: str,
    detail: dict[str, Any],
) -> PlacementPlan:
    grid = pipelines(obj, cand)
    ids = state.peers
    layers: tuple[int, ...] = ()
    micro = 0
    if isinstance(obj, StepObjective):
        br = obj.breakdown([cand.stats[o] for o in cand.order], cand.edges)
        layers, micro = br.layers, br.micro_batches
        detail = {**detail, "pipeline_s": br.pipeline, "dp_exposed_s": br.dp_exposed}
    return PlacementPlan(
        objective=obj.name,
        stages=tuple(tuple(ids[int(d)] for d in row) for row in grid),
        spares=tuple(ids[int(d)] for d in sorted(cand.spares.tolist())),
        cost=float(cand.cost),
        lower_bound=lower,
        bound_method=method,
        layers=layers,
        micro_batches=micro,
        template=template,
        detail=detail,
    )


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


def plan(
    state: PlanningState,
    job: Job,
    now: float,
    previous: PlacementPlan | None = None,
    cfg: PlannerConfig | None = None,
) -> tuple[PlacementPlan | None, str]:
    """Plan from scratch, or repair `previous` after peers left or joined or links changed.

    `now` (seconds, caller's clock) is recorded in the plan's detail; the plan does not depend on it.
    """
    cfg = cfg or PlannerConfig()
    if previous is None:
        result, reason = fresh_plan(state, job, cfg)
    else:
        from potluck.coordinator.replan import repair

        result, reason = repair(state, job, previous, cfg)
    if result is not None:
        result.detail["planned_at"] = now
    logger.info("plan: %s", reason)
    return result, reason
