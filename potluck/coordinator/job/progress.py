"""What the coordinator does next with a running job. Pure: ``next_action(...) -> (action, reason)``.

Actions: "plan" (no plan yet: plan when enough peers), "replan" (a placed peer left or a step failed:
restart everyone from the newest complete checkpoint under a new epoch), "done" (every placed peer
finished the last step), "fail" (several plans in a row failed without completing a step: a missing
dataset or a bad job, not churn), "wait" (training is moving). Progress records are the peers' signed reports;
only those of the current epoch count, so a late report from an aborted epoch cannot end or fail a job.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from potluck.coordinator.state import SwarmState
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import Progress, TrainPlan


@dataclass
class JobProgress:
    """The coordinator's memory of the job across epochs (updated from progress records)."""

    checkpoints: dict[int, int] = field(default_factory=dict)  # stage index of the writer -> newest step
    checkpoint_stages: int = 0  # stage count of the plan those checkpoints were written under
    latest: dict[str, Progress] = field(default_factory=dict)  # peer -> newest record of the current epoch
    compute_s: dict[str, float] = field(default_factory=dict)  # peer -> compute seconds of its last step
    failures: int = 0  # re-plans in a row after which no step was completed
    best_step: int = 0  # most steps ever completed by the whole swarm

    def update(self, plan: TrainPlan | None, records: Iterable[Progress]) -> None:
        if plan is None:
            return
        for rec in records:
            if rec.epoch != plan.epoch or rec.job != plan.job:
                continue
            if rec.state == "training" and rec.timing.compute > 0:
                self.compute_s[rec.peer_id] = rec.timing.compute
            old = self.latest.get(rec.peer_id)
            if old is None or (rec.step, rec.issued_at) >= (old.step, old.issued_at):
                self.latest[rec.peer_id] = rec
            if rec.checkpoint_step is not None and rec.replica == 0:
                if self.checkpoint_stages != len(plan.stages):
                    self.checkpoints, self.checkpoint_stages = {}, len(plan.stages)
                self.checkpoints[rec.stage] = max(self.checkpoints.get(rec.stage, 0), rec.checkpoint_step)

    def new_epoch(self, failed: bool) -> None:
        """A new plan replaces the current one; ``failed``: because the current one failed."""
        self.failures = self.failures + 1 if failed else 0
        self.latest = {}

    def advanced(self, plan: TrainPlan) -> None:
        """Call after ``update``: a swarm that completes new steps clears the failure count."""
        step = self.step(plan)
        if step > self.best_step:
            self.best_step, self.failures = step, 0

    def complete_checkpoint(self) -> int:
        """Newest step every stage reported a checkpoint for (0: none; start from scratch)."""
        if not self.checkpoint_stages or len(self.checkpoints) < self.checkpoint_stages:
            return 0
        return min(self.checkpoints.values())

    def step(self, plan: TrainPlan) -> int:
        """Steps the whole swarm has completed under ``plan``, as far as the reports tell."""
        placed = [p for st in plan.stages for p in st.peers]
        return min((self.latest[p].step if p in self.latest else plan.start_step) for p in placed)


def next_action(
    state: SwarmState, job: JobSpec, plan: TrainPlan | None, progress: JobProgress, max_failures: int = 3
) -> tuple[str, str]:
    if progress.failures >= max_failures:
        return "fail", f"{progress.failures} plans in a row failed before completing a step"
    if plan is None:
        return "plan", "no plan yet"
    if plan.status == "done":
        return "wait", "the job is done"
    placed = [p for st in plan.stages for p in st.peers]
    gone = [p for p in placed if p not in state.peers]
    if gone:
        return "replan", f"{len(gone)} placed peer(s) left: {', '.join(p[:12] for p in gone)}"
    failed = [r for p in placed if (r := progress.latest.get(p)) is not None and r.state == "failed"]
    if failed:
        return "replan", f"step failed at {failed[0].peer_id[:12]}: {failed[0].message}"
    if all((r := progress.latest.get(p)) is not None and r.state == "done" for p in placed):
        return "done", f"all {len(placed)} placed peers finished step {job.steps}"
    return "wait", f"training: step {progress.step(plan)} of {job.steps}"
