"""The planning vocabulary shared by fresh search and repair: inputs, knobs, the answer.

Pure data and two helpers (the objective for a shape, a search candidate turned into a plan), so that
``fresh`` and ``repair`` each import this module and never each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from potluck.coordinator.errors import PlanningError
from potluck.coordinator.placement.costmodel import DeviceSpec, DtfmJob, StepJob
from potluck.coordinator.placement.netmodel import NetModel
from potluck.coordinator.placement.objectives import DtfmObjective, Objective, StepObjective
from potluck.coordinator.placement.search import Candidate, GaConfig, pipelines

PeerId = str | int
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
    # Seconds each peer moved by a repair costs beyond its state transfer: it restarts on new layers,
    # fetches them from holders that may die meanwhile, and the plan's first step waits for it. Without
    # it a small model's migration prices at ~0 s and every repair reshuffled 3-4 peers for a gain of
    # 1-7 s over the horizon (scripts/bench_churn.py, 2026-11-24).
    move_overhead_s: float = 2.0
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
