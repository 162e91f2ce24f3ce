"""One simulated run: a churn trace against a policy, on the virtual clock.

Training is synchronous (as in potluck): when a placed peer leaves, the whole plan stalls until the
coordinator has noticed (at once for a graceful leave; within a poll and a dial for a crash that resets
its connections; at the step budget or the heartbeat's expiry for a machine that vanished silently:
``RunConfig.crash_detect_s``), decided, and every moved peer holds its state; then it trains at the new
plan's rate. Spares come and go freely. Rates are tokens/s from the real cost model (``plan.cost`` is
the step time). The static optimum is a fresh plan (longer search) for the live peers, every
``optimum_every_s``.
"""

from __future__ import annotations

import logging

import numpy as np

from potluck.coordinator.placement import PlacementPlan, PlannerConfig
from potluck.coordinator.placement.costmodel import StepJob
from potluck.sim.churn import HOUR, Trace
from potluck.sim.coordinator import Coordinator, Decision, stage_map, tokens_per_s
from potluck.sim.engine import EventQueue
from potluck.sim.errors import SimError
from potluck.sim.liveput import SessionHistory
from potluck.sim.population import Population
from potluck.sim.runconfig import RunConfig, RunResult

logger = logging.getLogger(__name__)


class _Run:
    def __init__(
        self,
        pop: Population,
        trace: Trace,
        job: StepJob,
        coord: Coordinator,
        cfg: RunConfig,
        rng: np.random.Generator,
    ) -> None:
        self.pop, self.trace, self.job, self.coord, self.cfg, self.rng = pop, trace, job, coord, cfg, rng
        self.q = EventQueue()
        self.res = RunResult(cfg.policy, cfg.churn_aware, cfg.hours)
        self.since: dict[int, float] = {}  # live identity -> session start
        self.hist = SessionHistory()
        self.plan: PlacementPlan | None = None
        self.grid: list[list[int]] = []  # naive: the surviving columns of the fixed plan
        self.rate = 0.0
        self.opt_rate = 0.0
        self.last_t = 0.0
        self.epoch = 0
        self.broken = False
        self.decision_due = False
        self.joined_since = False

    def advance(self, t: float) -> None:
        dt = t - self.last_t
        self.res.tokens += self.rate * dt
        self.res.optimum_tokens += self.opt_rate * dt
        self.last_t = t

    def live(self) -> np.ndarray:
        return np.array(sorted(self.since), dtype=np.int64)

    def stay(self, live: np.ndarray) -> np.ndarray | None:
        if not (self.cfg.churn_aware or self.cfg.equal_search):
            return None
        ages = self.q.now - np.array([self.since[int(i)] for i in live])
        return self.hist.survival(live, ages, self.cfg.liveput_horizon_s)

    def setup(self) -> None:
        tr, horizon = self.trace, self.cfg.hours * HOUR
        for k in range(len(tr.ident)):
            s, e, i = float(tr.start[k]), float(tr.end[k]), int(tr.ident[k])
            if e <= 0 or s >= horizon:
                if e <= 0:
                    self.hist.record(i, e - s)  # warm-up sessions: history the coordinator saw
                continue
            if s <= 0:
                self.since[i] = s
            else:
                self.q.push(s, "join", i)
            if e < horizon:
                self.q.push(e, "leave", (i, bool(tr.graceful[k])))
        t = 0.0
        while t < horizon:
            self.q.push(t, "optimum")
            t += self.cfg.optimum_every_s
        t = self.cfg.sample_s
        while t <= horizon:
            self.q.push(t, "sample")
            t += self.cfg.sample_s
        if self.cfg.policy == "periodic":
            t = self.cfg.periodic_s
            while t < horizon:
                self.q.push(t, "periodic")
                t += self.cfg.periodic_s
        self.q.push(horizon, "end")

    def apply(self, d: Decision, kind: str) -> None:
        before = stage_map(self.plan)
        rec = {
            "t_h": self.q.now / HOUR,
            "decision_s": d.decision_s,
            "moved": d.moved,
            "state_bytes": d.state_bytes,
            "handoff_s": d.handoff_s,
            "fresh": float(kind != "repair"),
            "periodic": float(kind == "periodic"),
        }
        self.res.decisions.append(rec)
        self.plan = d.plan
        self.grid = [list(map(int, row)) for row in d.plan.stages] if d.plan is not None else []
        self.epoch += 1
        self.broken = False
        self.rate = 0.0
        if kind == "first":  # the swarm's start is not churn: no hand-off is charged
            self.rate = tokens_per_s(self.job, d.plan)
            return
        decided = self.q.now + (d.decision_s if self.cfg.charge_decision_time else self.cfg.poll_s)
        full = tokens_per_s(self.job, d.plan)
        if self.cfg.background_handoff and d.plan is not None and d.moved:
            after = stage_map(d.plan)
            movers = {p for p, j in after.items() if before.get(p) != j}
            cols = [i for i in range(d.plan.n_replicas) if not any(row[i] in movers for row in d.plan.stages)]
            if cols:
                grid = [[int(row[i]) for i in cols] for row in d.plan.stages]
                interim = (
                    self.job.batch.sequences_per_step * self.job.model.seq_len / self.coord.grid_cost(grid)
                )
                self.q.push(decided + self.cfg.restart_s, "resume", (self.epoch, interim))
        self.q.push(decided + d.handoff_s + self.cfg.restart_s, "resume", (self.epoch, full))

    def decide(self, fresh: bool, kind: str) -> None:
        live = self.live()
        d = self.coord.decide(self.q.now, live, self.plan, fresh, self.stay(live), not self.cfg.churn_aware)
        self.apply(d, kind)

    def on_leave(self, ident: int, graceful: bool) -> None:
        start = self.since.pop(ident, None)
        if start is None:
            return
        self.hist.record(ident, self.q.now - start)
        self.res.leaves += 1
        if not any(ident in row for row in self.grid):
            return
        self.res.placed_departures += 1
        if self.cfg.policy != "naive":
            self.rate = 0.0  # synchronous: the step waits for the missing peer until a new plan
            self.broken = True
        delay = 0.0 if graceful else self.cfg.crash_detect_s(self.rng.random(), self.rng.random())
        if self.cfg.policy == "naive":
            self.rate = 0.0
        self.q.push(self.q.now + delay, "detect", ident)

    def on_detect(self, ident: int) -> None:
        if self.cfg.policy == "naive":
            self.grid = [
                [x for x, keep in zip(row, self._alive_cols(), strict=True) if keep] for row in self.grid
            ]
            self.rate = 0.0
            if self.grid and self.grid[0]:
                self.rate = (
                    self.job.batch.sequences_per_step
                    * self.job.model.seq_len
                    / self.coord.grid_cost(self.grid)
                )
            return
        if not self.decision_due:
            self.decision_due = True
            self.q.push(self.q.now + self.cfg.poll_s, "decide")

    def _alive_cols(self) -> list[bool]:
        return [all(row[i] in self.since for row in self.grid) for i in range(len(self.grid[0]))]

    def handle(self, kind: str, data: object) -> bool:
        now = self.q.now
        self.advance(now)
        if kind == "join":
            assert isinstance(data, int)
            self.since[data] = now
            self.res.joins += 1
            self.joined_since = True
            if self.cfg.policy == "scratch" and not self.decision_due:
                self.decision_due = True
                self.q.push(now + self.cfg.scratch_every_s, "decide")
        elif kind == "leave":
            assert isinstance(data, tuple)
            self.on_leave(int(data[0]), bool(data[1]))
        elif kind == "detect":
            assert isinstance(data, int)
            self.on_detect(data)
        elif kind == "decide":
            self.decision_due = False
            self.decide(self.cfg.policy == "scratch", "scratch" if self.cfg.policy == "scratch" else "repair")
        elif kind == "resume":
            assert isinstance(data, tuple)
            if data[0] == self.epoch and not self.broken:
                self.rate = float(data[1])
                self.opt_rate = max(self.opt_rate, self.rate)
        elif kind == "periodic":
            self.periodic()
        elif kind == "optimum":
            # The static optimum for the live peers: a fresh search over the pool (the running plan's live
            # peers first), and never below the rate of a plan actually run on live peers (see resume).
            d = self.coord.decide(now, self.live(), self.plan, True, None)
            self.opt_rate = tokens_per_s(self.job, d.plan)
            if (
                self.plan is not None
                and not self.broken
                and all(x in self.since for row in self.grid for x in row)
            ):
                self.opt_rate = max(self.opt_rate, tokens_per_s(self.job, self.plan))
            self.res.optimum_s.append(d.decision_s)
        elif kind == "sample":
            self.res.samples.append((now / HOUR, self.rate, self.opt_rate))
            self.res.totals.append((now / HOUR, self.res.tokens, self.res.optimum_tokens))
        return kind != "end"

    def periodic(self) -> None:
        if self.broken or self.decision_due or self.plan is None:
            return
        live = self.live()
        d = self.coord.decide(self.q.now, live, self.plan, True, self.stay(live), not self.cfg.churn_aware)
        new_rate, old_rate = tokens_per_s(self.job, d.plan), tokens_per_s(self.job, self.plan)
        if d.plan is None or new_rate <= old_rate:
            return
        # Adopt only when the gain over the planner's horizon repays the stall of the hand-off.
        horizon = self.coord.cfg.horizon_steps * d.plan.cost
        if (new_rate - old_rate) * horizon > old_rate * (d.handoff_s + self.cfg.restart_s):
            self.apply(d, "periodic")

    def go(self) -> RunResult:
        self.setup()
        self.decide(True, "first")
        while len(self.q) and self.handle(*self._pop()):
            pass
        return self.res

    def _pop(self) -> tuple[str, object]:
        ev = self.q.pop()
        return ev.kind, ev.data


def trace_graceful_share(trace: Trace) -> float:
    return float(trace.graceful.mean()) if len(trace.graceful) else 0.0


def simulate(
    pop: Population,
    trace: Trace,
    job: StepJob,
    cfg: RunConfig,
    planner: PlannerConfig,
    rng: np.random.Generator,
    fresh_planner: PlannerConfig | None = None,
) -> RunResult:
    """Run `trace` against `cfg.policy`; the result's `fraction` is tokens over the static optimum's."""
    if trace.identities > pop.n:
        raise SimError(f"the trace has {trace.identities} identities, the population only {pop.n}")
    # Liveput's price of a departure: the expected detection, the poll and the restart here; the
    # coordinator adds each candidate plan's own hand-off (unless newcomers fetch in the background).
    stall = (1.0 - trace_graceful_share(trace)) * cfg.crash_detect_mean_s() + cfg.poll_s + cfg.restart_s
    coord = Coordinator(
        pop,
        job,
        planner,
        cfg.pool,
        fresh_planner,
        stall_s=stall,
        horizon_s=cfg.liveput_horizon_s,
        count_handoff=not cfg.background_handoff,
    )
    return _Run(pop, trace, job, coord, cfg, rng).go()


__all__ = ["RunConfig", "RunResult", "simulate", "stage_map"]
