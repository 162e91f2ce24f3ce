"""The coordinator's decisions in the simulator: the real ``placement.plan`` on a bounded planning pool.

A 10,000-peer swarm cannot be planned as one: the planner's link matrices alone would be 10^8 pairs
(0.8 GB each), and the fresh search screens shapes over every peer. The coordinator therefore plans
over a *pool* (hierarchical planning): the peers of the current plan that are still live, its live
spares, and the best-ranked other live peers up to ``pool`` in all. Ranking is a cheap per-peer score
(compute and uplink, each relative to the swarm's median; a slow uplink caps a peer's worth to a
data-parallel group whatever its GPU). The decision time reported is the real code's: building the
pool's ``PlanningState`` and running ``placement.plan`` (measured with a monotonic clock, the only
clock the simulator reads, and only to report and charge the coordinator's CPU time).

Policies: "scratch" (a fresh plan on every change), "repair" (``plan`` with the previous plan: local
repair, moves only when they repay their migration over ``horizon_steps``), "periodic" (repair, plus a
fresh plan every ``periodic_s`` adopted when it repays its hand-off), "naive" (the first plan, fixed:
pipelines with a dead peer drop). ``churn_aware`` adds liveput (``liveput.py``) to any of them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from potluck.coordinator.placement import PeerId, PlacementPlan, PlannerConfig, plan
from potluck.coordinator.placement.costmodel import StepJob
from potluck.coordinator.placement.repair import state_bytes_per_peer
from potluck.coordinator.placement.search import evaluate_in_order
from potluck.coordinator.placement.types import make_objective
from potluck.sim.errors import SimError
from potluck.sim.population import Population, planning_state

logger = logging.getLogger(__name__)

POLICIES = ("scratch", "repair", "periodic", "naive")
TIERS = (0.0, 0.5, 0.75, 0.9)  # durability quantiles a churn-aware fresh decision plans a pool for


@dataclass(frozen=True)
class Decision:
    plan: PlacementPlan | None
    reason: str
    decision_s: float  # coordinator CPU time of this decision (wall clock of the real planner call)
    moved: int  # peers that must fetch a stage's state (new to the plan, or changed stage)
    state_bytes: float  # bytes those peers fetch
    handoff_s: float  # time until the last of them holds its state (parallel transfers)


def tokens_per_s(job: StepJob, p: PlacementPlan | None) -> float:
    if p is None or not np.isfinite(p.cost) or p.cost <= 0:
        return 0.0
    return job.batch.sequences_per_step * job.model.seq_len / p.cost


def stage_map(p: PlacementPlan | None) -> dict[PeerId, int]:
    """Each placed peer's stage."""
    return {} if p is None else {x: j for j, row in enumerate(p.stages) for x in row}


class Coordinator:
    """Planning pool, policy and the hand-off cost of each decision."""

    def __init__(
        self,
        pop: Population,
        job: StepJob,
        cfg: PlannerConfig,
        pool: int,
        fresh_cfg: PlannerConfig | None = None,
        durable_quantile: float = 0.0,
        stall_s: float = 40.0,
        horizon_s: float = 3600.0,
        count_handoff: bool = True,
    ) -> None:
        if pool < 2:
            raise SimError(f"the planning pool needs >= 2 peers, not {pool}")
        self.pop, self.job, self.cfg, self.pool = pop, job, cfg, pool
        self.fresh_cfg = fresh_cfg or cfg
        self.durable_quantile = durable_quantile
        # Liveput: seconds every departure stalls the swarm besides the hand-off, and the horizon.
        self.stall_s, self.horizon_s, self.count_handoff = stall_s, horizon_s, count_handoff
        self._med_tflops = float(np.median(pop.tflops))
        self._med_up = float(np.median(pop.up_gbps))

    def score(self, ids: np.ndarray, stay: np.ndarray | None) -> np.ndarray:
        compute = self.pop.tflops[ids] / self._med_tflops
        uplink = self.pop.up_gbps[ids] / self._med_up
        s = 1.0 / (1.0 / compute + 1.0 / uplink)
        if stay is None:
            return s
        # Liveput: in a synchronous plan any departure stalls every peer, so a plan's expected rate falls
        # with the product of its peers' chances to stay, while a faster peer adds only its share. Rank
        # the durable tier (chance at or above the `durable_quantile` of live peers) first, by score.
        if self.durable_quantile <= 0.0:
            return s
        tier = stay >= np.quantile(stay, self.durable_quantile)
        return s + np.where(tier, 1e6, 0.0)

    def pool_of(
        self, live: np.ndarray, previous: PlacementPlan | None, stay: np.ndarray | None
    ) -> np.ndarray:
        """Live peers of the previous plan (placed, then spares), then the best-scored others."""
        live_set = set(live.tolist())
        keep: list[int] = []
        if previous is not None:
            keep = [int(x) for row in previous.stages for x in row if int(x) in live_set]
            keep += [int(x) for x in previous.spares if int(x) in live_set][: max(self.pool - len(keep), 0)]
        room = self.pool - len(keep)
        if room > 0:
            taken = set(keep)
            scores = self.score(live, stay)
            order = np.argsort(-scores, kind="stable")
            extra = [int(live[k]) for k in order[: room + len(keep)] if int(live[k]) not in taken][:room]
            keep += extra
        return np.array(sorted(keep), dtype=np.int64)

    def decide(
        self,
        now: float,
        live: np.ndarray,
        previous: PlacementPlan | None,
        fresh: bool,
        stay_live: np.ndarray | None = None,
        blind: bool = False,
    ) -> Decision:
        """One decision: `fresh` ignores `previous` (scratch, periodic, the first plan).

        `stay_live` (aligned with `live`): each live peer's chance to stay ``liveput_horizon_s``, for a
        churn-aware decision. A fresh one plans a pool per durability tier (``TIERS``) and keeps the plan
        of best liveput, rate x (1 - stall_s / horizon x expected departures among its peers); repairs then
        fill their pool from that tier. `blind` keeps the same candidate pools but picks by rate alone and
        repairs from the score-ranked pool: the churn-blind planner given the same search effort.
        """
        t0 = time.perf_counter()
        cfg = self.fresh_cfg if fresh or previous is None else self.cfg
        tiers = TIERS if stay_live is not None and (fresh or previous is None) else (self.durable_quantile,)
        best: tuple[float, PlacementPlan | None, str, float] | None = None
        for q in tiers:
            self.durable_quantile = q
            state = planning_state(self.pop, self.pool_of(live, previous, stay_live))
            new, reason = plan(state, self.job, now, None if fresh else previous, cfg)
            value = tokens_per_s(self.job, new) if blind else self.liveput(new, live, stay_live)
            if best is None or value > best[0]:
                best = (value, new, reason, q)
        assert best is not None
        _, new, reason, self.durable_quantile = best
        if blind:
            self.durable_quantile = 0.0
        decision_s = time.perf_counter() - t0
        moved, nbytes, handoff = self.handoff(previous, new, live)
        return Decision(new, reason, decision_s, moved, nbytes, handoff)

    def liveput(self, p: PlacementPlan | None, live: np.ndarray, stay_live: np.ndarray | None) -> float:
        """Expected tokens/s over the horizon: each expected departure of a placed peer costs `stall_s`
        plus the hand-off of one stage of this plan at the placed peers' median downlink."""
        rate = tokens_per_s(self.job, p)
        if p is None or stay_live is None:
            return rate
        placed = np.array(sorted(int(x) for row in p.stages for x in row), dtype=np.int64)
        leave = float((1.0 - stay_live[np.searchsorted(live, placed)]).sum())
        stall = self.stall_s
        if self.count_handoff:
            down = float(np.median(self.pop.down_gbps[placed])) * 1e9 / 8.0  # bytes/s
            stall += state_bytes_per_peer(self.job, p.n_stages) / down
        return rate * max(0.0, 1.0 - leave * stall / self.horizon_s)

    def handoff(
        self, previous: PlacementPlan | None, new: PlacementPlan | None, live: np.ndarray
    ) -> tuple[int, float, float]:
        """(peers moved, bytes, seconds): each moved peer fetches its stage from the best live holder's
        uplink (its own download caps it); transfers run in parallel."""
        if new is None:
            return 0, 0.0, 0.0
        before, after = stage_map(previous), stage_map(new)
        movers = [(p, j) for p, j in after.items() if before.get(p) != j]
        if not movers:
            return 0, 0.0, 0.0
        live_set = set(live.tolist())
        per_peer = state_bytes_per_peer(self.job, new.n_stages)
        holders: dict[int, float] = {}
        for p, j in before.items():
            if int(p) in live_set and (previous is not None and previous.n_stages == new.n_stages):
                holders[j] = max(holders.get(j, 0.0), float(self.pop.up_gbps[int(p)]))
        best_any = max(holders.values(), default=float(np.median(self.pop.up_gbps)))
        worst = 0.0
        for p, j in movers:
            src = holders.get(j, best_any)
            rate = min(float(self.pop.down_gbps[int(p)]), src) * 1e9 / 8.0  # bytes/s
            worst = max(worst, per_peer / rate)
        return len(movers), per_peer * len(movers), worst

    def grid_cost(self, grid: list[list[int]]) -> float:
        """Step time (s) of a fixed grid stages[j][i] of identity ids, by the real cost model."""
        if not grid or not grid[0]:
            return float("inf")
        ids = np.array(sorted({x for row in grid for x in row}), dtype=np.int64)
        state = planning_state(self.pop, ids)
        index = {int(x): k for k, x in enumerate(ids)}
        obj = make_objective(state, self.job, len(grid), len(grid[0]))
        groups = np.array([[index[x] for x in row] for row in grid], dtype=np.int64)
        return float(evaluate_in_order(obj, groups, np.array([], dtype=np.int64)).cost)
