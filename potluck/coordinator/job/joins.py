"""The coordinator's desk for peers that join a running job. Pure: records and ``now`` in, no I/O.

Within a poll of its first heartbeat a newcomer is named in the plan as a spare with the reason it is
not placed yet ("checking whether placing it pays", then the verdict with its numbers); the service
re-publishes the SAME epoch with the new spares list, which placed peers ignore (they act only on a
higher epoch) and a newcomer takes as its first plan. Placing newcomers is priced (``improve``) at most
every ``check_s`` seconds, since each price is a planner search (about 2 s of CPU), and again only when
the set of newcomers changed or ``recheck_s`` passed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from potluck.coordinator.job.improve import ImproveConfig, JoinEvaluation, evaluate_join, join_verdict
from potluck.coordinator.job.plan import usable_peers
from potluck.coordinator.state import SwarmState
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import Spare, TrainPlan

REASON_CHARS = 128  # Spare.reason (a ShortText) holds at most this many characters


class JoinDesk:
    def __init__(self, check_s: float, recheck_s: float, improve: ImproveConfig | None = None) -> None:
        self.check_s, self.recheck_s = check_s, recheck_s  # seconds between prices; between equal ones
        self.improve = improve or ImproveConfig()
        self.base: list[Spare] = []  # the spares the current plan was made with
        self.notes: dict[str, str] = {}  # peer that came after the plan -> what it is told
        self.joined: dict[str, int] = {}  # peer that came after the plan -> the step it was first seen at
        self.checked_at = -math.inf  # monotonic seconds of the last price
        self.checked_for: frozenset[str] = frozenset()

    def new_plan(self, plan: TrainPlan) -> None:
        """A new epoch: its planner saw every peer, so nobody is a newcomer to it."""
        self.base, self.notes, self.joined, self.checked_for = list(plan.spares), {}, {}, frozenset()

    def spares(self, plan: TrainPlan, state: SwarmState, job: JobSpec, step: int) -> list[Spare]:
        """The plan's spares as they should read at ``step``: the plan's own (still live) and each peer
        that came after it, with what it is told; a newcomer that cannot hold a layer is told why."""
        usable, unusable = usable_peers(state, job)
        placed = {p for st in plan.stages for p in st.peers}
        known = {s.peer_id for s in self.base} | placed
        for p in usable:
            if p not in known and p not in self.notes:
                self.joined[p] = step
                self.notes[p] = f"joined at step {step}; checking whether placing it pays"
        for s in unusable:
            if s.peer_id not in known:
                self.notes[s.peer_id] = s.reason
        live = state.peers
        told = [Spare(peer_id=p, reason=r[:REASON_CHARS]) for p, r in sorted(self.notes.items()) if p in live]
        kept = [s for s in self.base if s.peer_id in state.peers and s.peer_id not in self.notes]
        return kept + told

    def newcomers(self, plan: TrainPlan, state: SwarmState, job: JobSpec) -> list[str]:
        """Usable live peers that came after the plan and are not placed by it."""
        usable = set(usable_peers(state, job)[0])
        return sorted(p for p in self.notes if p in usable and plan.position(p) is None)

    def due(self, newcomers: Sequence[str], now: float) -> bool:
        """Whether to price placing ``newcomers`` at monotonic time ``now``."""
        if not newcomers or now - self.checked_at < self.check_s:
            return False
        return frozenset(newcomers) != self.checked_for or now - self.checked_at >= self.recheck_s

    def evaluate(
        self,
        state: SwarmState,
        job: JobSpec,
        plan: TrainPlan,
        step: int,
        speeds: Mapping[str, float],
        newcomers: Sequence[str],
        dht_now: float,
        now: float,
        measured_s: float = 0.0,
        measured_ratios: Mapping[str, float] | None = None,
    ) -> tuple[str, str, JoinEvaluation]:
        """(decision, reason, evaluation): "improve" to re-plan with the newcomers, else "keep" and
        each newcomer is told ``reason``. Seconds of CPU: run it off the event loop.
        ``measured_ratios``: the activation codecs' ratios measured on the job (``MeasuredRatios``)."""
        self.checked_at, self.checked_for = now, frozenset(newcomers)
        ev = evaluate_join(
            state,
            job,
            plan,
            step,
            speeds,
            newcomers,
            dht_now,
            self.improve,
            None,
            measured_s,
            measured_ratios,
        )
        decision, reason = join_verdict(ev.offer, self.improve)
        forced, wider = job.limits.replicas, ev.plan.n_replicas if ev.plan is not None else 0
        if decision == "keep" and forced is not None and plan.n_replicas < wider <= forced:
            # a running job that lost replicas trained narrower than it asked (plan.make_train_plan);
            # a newcomer that restores the width it forces is placed whatever the step-time model says
            decision, reason = "improve", f"back toward the {forced} replicas the job forces: {reason}"
        if decision == "keep":
            for p in newcomers:
                self.notes[p] = f"joined at step {self.joined.get(p, step)}; {reason}"
        return decision, reason, ev
