"""What the coordinator does next with a running job. Pure: ``next_action(..., now) -> (action, reason)``.

Actions: "plan" (no plan yet: plan when enough peers), "replan" (a placed peer left or a step failed:
restart everyone from the newest complete checkpoint under a new epoch), "leave" (placed peers announced
a graceful leave and nothing failed: re-plan without them while they still train and serve their
state, see ``handoff``), "done" (every placed peer
finished the last step), "fail" (plans keep failing and fewer than ``min_peers`` usable peers are left to
try again with), "hold" (a broken plan waits out its backoff or the confirmation of a suspect), "wait"
(training is moving). Progress records are the peers' signed reports; only those of the current epoch
count, so a late report from an aborted epoch cannot end or fail a job.

Transient faults never end a job while enough usable peers heartbeat: a failed plan is retried after an
exponential backoff (``RetryPolicy``). A "failed" record may name *suspects* (peers the reporter could
not reach); a suspect is left out of the next plan only if it has not heartbeated since the suspicion
(its heartbeat interval plus ``slack_s`` gives it time to), and the re-plan waits for that verdict, so
it never goes ahead with a peer that just failed unless the peer has heartbeated since. Times are DHT
times (unix seconds), the clock peers sign their records with.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from potluck.coordinator.state import SwarmState
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.membership import PeerView
from potluck.protocol.training import Holding, Progress, TrainPlan

HEARTBEATS_PER_TTL = 3.0  # peers refresh their heartbeat every third of its lifetime (peer.config)
COMPUTE_EMA = 0.3  # weight of a newly reported step in a peer's smoothed compute time (reports come ~1/s)
COMPUTE_WARMUP = 2  # a plan's first reported steps per peer that its speed is not measured on


@dataclass(frozen=True)
class RetryPolicy:
    """When failed plans are retried, and when retrying stops."""

    first_backoff_s: float = 1.0  # wait before the second retry in a row; the first one goes at once
    max_backoff_s: float = 30.0  # cap on the doubling wait between retries
    slack_s: float = 5.0  # beyond a suspect's heartbeat interval, time for its next heartbeat to land
    max_failures: int = 3  # failed plans in a row after which a swarm short of usable peers gives up

    def backoff_s(self, failures: int) -> float:
        """Wait before re-planning after a plan failed, ``failures`` failed plans in a row before it:
        0, 1, 2, 4, ... seconds, capped at ``max_backoff_s``."""
        if failures <= 0:
            return 0.0
        return min(self.max_backoff_s, self.first_backoff_s * 2.0 ** (failures - 1))


@dataclass
class JobProgress:
    """The coordinator's memory of the job across epochs (updated from progress records)."""

    checkpoints: dict[int, int] = field(default_factory=dict)  # stage index of the writer -> newest step
    checkpoint_stages: int = 0  # stage count of the plan those checkpoints were written under
    latest: dict[str, Progress] = field(default_factory=dict)  # peer -> newest record of the current epoch
    # peer -> compute seconds of a step of the current epoch's plan (its work there), smoothed over the
    # steps it reported (COMPUTE_EMA per new step): one step's compute on a busy machine varies 2x, and
    # a plan prices a peer well below its stage's other replicas as a straggler (``job.speeds``)
    compute_s: dict[str, float] = field(default_factory=dict)
    _compute_at: dict[str, int] = field(default_factory=dict)  # peer -> the step compute_s last took in
    _compute_n: dict[str, int] = field(default_factory=dict)  # peer -> steps of this plan it reported
    _compute_epoch: int = -1  # the plan epoch compute_s measures
    failures: int = 0  # re-plans in a row after which no step was completed
    best_step: int = 0  # most steps ever completed by the whole swarm
    suspects: dict[str, float] = field(default_factory=dict)  # peer -> DHT time of the newest suspicion
    unreachable: dict[str, float] = field(default_factory=dict)  # peer -> DHT time a direct probe failed
    # peer -> the checkpoints it says it keeps on its disk (Progress.stored), by layers, so that they stay
    # meaningful after the plan's cut changed (job.resume.checkpoint_step). Kept across epochs.
    stored: dict[str, list[Holding]] = field(default_factory=dict)
    # peer -> the live state it said it holds in its newest record of any epoch (Progress.holds), so a
    # plan that failed before its peers reported does not make the swarm forget what they still serve.
    holdings: dict[str, Holding] = field(default_factory=dict)
    _holdings_at: dict[str, float] = field(default_factory=dict)  # peer -> issued_at of that record
    # peer -> the other live states of that record (Progress.also_holds: wider layers at the same step)
    also_holdings: dict[str, list[Holding]] = field(default_factory=dict)
    _failed_runs: set[tuple[str, int]] = field(default_factory=set)  # (reporter, epoch) failures counted

    def _measure(self, peer: str, step: int, compute_s: float) -> None:
        """Fold one reported step's compute time in; the first COMPUTE_WARMUP steps of a plan are skipped
        (its first steps build the stage and warm the allocator: seen 5x slower than the rest)."""
        self._compute_at[peer] = step
        self._compute_n[peer] = n = self._compute_n.get(peer, 0) + 1
        if n <= COMPUTE_WARMUP:
            return
        old = self.compute_s.get(peer)
        self.compute_s[peer] = compute_s if old is None else old + COMPUTE_EMA * (compute_s - old)

    def update(self, plan: TrainPlan | None, records: Iterable[Progress]) -> None:
        if plan is None:
            return
        if plan.epoch != self._compute_epoch:  # a new plan: new work for everyone, measured anew
            self.compute_s, self._compute_at, self._compute_n = {}, {}, {}
            self._compute_epoch = plan.epoch
        for rec in records:
            if rec.job != plan.job:
                continue
            if rec.holds is not None and rec.issued_at >= self._holdings_at.get(rec.peer_id, -1.0):
                self.holdings[rec.peer_id], self._holdings_at[rec.peer_id] = rec.holds, rec.issued_at
                self.also_holdings[rec.peer_id] = list(rec.also_holds)
            # The reporter's record often lands after the coordinator already re-planned on a faster
            # report of the same failure (seen: a dead peer placed in four plans in a row, each failing
            # at its start barrier, until its heartbeat expired), so the previous plan's failures accuse
            # too. Each run fails once: its first failed record dates the suspicion; later copies of it
            # (re-published with a fresh time, e.g. to announce a checkpoint copy) must not renew it, or
            # a live suspect could never heartbeat "after" it.
            first = (rec.peer_id, rec.epoch) not in self._failed_runs
            if rec.state == "failed" and rec.epoch >= plan.epoch - 1 and first:
                self._failed_runs.add((rec.peer_id, rec.epoch))
                for s in rec.suspects:
                    if s != rec.peer_id:  # a peer cannot get itself excluded
                        self.suspects[s] = max(self.suspects.get(s, 0.0), rec.issued_at)
            if rec.epoch != plan.epoch:
                continue
            if (
                rec.state == "training"
                and rec.timing.compute > 0
                and self._compute_at.get(rec.peer_id) != rec.step
            ):
                self._measure(rec.peer_id, rec.step, rec.timing.compute)
            old = self.latest.get(rec.peer_id)
            if old is None or (rec.step, rec.issued_at) >= (old.step, old.issued_at):
                self.latest[rec.peer_id] = rec
            if rec.stored:
                self.stored[rec.peer_id] = list(rec.stored)
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
        """Steps the whole swarm has completed under ``plan``, as far as the reports tell. A placed peer
        that has not reported under ``plan`` counts at its start only if the swarm was seen to get
        there: a hand-off plan starts at a step the old plan has yet to reach, and a live resume may
        start a step or two past the newest report; until its peers say so, that step is not done."""
        placed = [p for st in plan.stages for p in st.peers]
        unreported = min(plan.start_step, self.best_step)
        return min((self.latest[p].step if p in self.latest else unreported) for p in placed)

    def failed(self, plan: TrainPlan) -> list[Progress]:
        """The "failed" records of ``plan``'s placed peers (their newest of this epoch)."""
        placed = [p for st in plan.stages for p in st.peers]
        return [r for p in placed if (r := self.latest.get(p)) is not None and r.state == "failed"]

    def probe_failed(self, peer: str, at: float) -> None:
        """The coordinator could not reach ``peer`` directly at DHT time ``at``."""
        self.unreachable[peer] = max(self.unreachable.get(peer, -1.0), at)

    def confirm_gone(self, peer: str, at: float) -> None:
        """The coordinator's own probe at DHT time ``at`` found ``peer``, which no report named, gone: a
        suspect from just before that probe, so ``verdicts`` excludes it at once."""
        self.suspects[peer] = max(self.suspects.get(peer, 0.0), at - 1e-3)
        self.probe_failed(peer, at)

    def dead(self, peer: str, view: PeerView) -> bool:
        """The coordinator's own probe found ``peer`` refusing after it was suspected, and it has not
        heartbeated since: dead before its heartbeat expires."""
        since = self.suspects.get(peer)
        return since is not None and view.record.issued_at <= since <= self.unreachable.get(peer, -1.0)

    def verdicts(
        self, state: SwarmState, now: float, retry: RetryPolicy | None = None
    ) -> tuple[list[str], list[str]]:
        """(pending, excluded) suspects at ``now``. A suspect that heartbeated after its suspicion is
        cleared (neither list); one that did not is excluded at once when the coordinator's own direct
        probe failed after the suspicion (``probe_failed``), else pending for its heartbeat interval
        plus ``slack_s``, then excluded; one with no live heartbeat at all is excluded at once."""
        retry = retry or RetryPolicy()
        pending: list[str] = []
        excluded: list[str] = []
        for peer, since in sorted(self.suspects.items()):
            view = state.peers.get(peer)
            if view is None:
                excluded.append(peer)
            elif view.record.issued_at > since:
                continue
            else:
                # Confirmed by two witnesses (the reporter and our own failed probe), or by silence.
                overdue = now - since > heartbeat_interval_s(view) + retry.slack_s
                (excluded if self.dead(peer, view) or overdue else pending).append(peer)
        return pending, excluded


def heartbeat_interval_s(view: PeerView) -> float:
    """How often this peer refreshes its heartbeat, read off the lifetime it gave its latest one."""
    return max(0.0, view.expiration - view.record.issued_at) / HEARTBEATS_PER_TTL


def next_action(
    state: SwarmState,
    job: JobSpec,
    plan: TrainPlan | None,
    progress: JobProgress,
    now: float,
    *,
    usable: Collection[str] | None = None,
    retry: RetryPolicy | None = None,
) -> tuple[str, str]:
    """``usable``: the live peers able to hold a layer of the job (``plan.usable_peers``; None: all)."""
    retry = retry or RetryPolicy()
    if plan is None:
        return "plan", "no plan yet"
    if plan.status == "done":
        return "wait", "the job is done"
    placed = [p for st in plan.stages for p in st.peers]
    # Gone: its heartbeat expired, or the coordinator's own dial found it dead since it last heartbeated
    # (``probes.ConnectionWatch``: a kill that no step has failed on yet).
    gone = [p for p in placed if p not in state.peers or progress.dead(p, state.peers[p])]
    failed = progress.failed(plan)
    if not gone and not failed:
        if all((r := progress.latest.get(p)) is not None and r.state == "done" for p in placed):
            return "done", f"all {len(placed)} placed peers finished step {job.steps}"
        return "wait", f"training: step {progress.step(plan)} of {job.steps}"
    graceful = bool(gone) and not failed and set(gone) <= state.leaving
    if graceful:
        why = f"{len(gone)} placed peer(s) leaving: {', '.join(p[:12] for p in gone)}"
    elif gone:
        why = f"{len(gone)} placed peer(s) left: {', '.join(p[:12] for p in gone)}"
    else:
        why = f"step failed at {failed[0].peer_id[:12]}: {failed[0].message}"
    pending, excluded = progress.verdicts(state, now, retry)
    left = [p for p in (state.peers if usable is None else usable) if p in state.peers and p not in excluded]
    if len(left) < job.min_peers and progress.failures >= retry.max_failures:
        return "fail", (
            f"{progress.failures} plans in a row failed before completing a step and only "
            f"{len(left)} usable live peer(s) remain of the {job.min_peers} the job needs ({why})"
        )
    # Below min_peers too: a running job re-plans on the peers it has while they hold the model (the
    # planner says what it waits for when they cannot; ``plan.make_train_plan(running=True)``).
    if pending:
        return "hold", f"{why}; confirming suspect(s) {', '.join(p[:12] for p in pending)} by heartbeat"
    if failed:
        since = min(r.issued_at for r in failed)
        wait = since + retry.backoff_s(progress.failures) - now
        if wait > 0:
            return "hold", f"{why}; retrying in {wait:.1f} s ({progress.failures} failed plans in a row)"
    return ("leave" if graceful else "replan"), why
