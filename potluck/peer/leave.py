"""A peer's part in a re-plan nobody had to stop for: when to switch plans, and when a leave may end.

Pure: views and ``now`` (monotonic seconds) in, ``(decision, reason)`` out; the worker and the daemon
do the I/O.

**Switching.** A plan that starts ahead of the step a running peer stands at (``coordinator/job/handoff``)
means: train on under the old plan until exactly that step, then switch, so that every peer of the old
plan stops at the same step and holds the same state. A plan that starts at or behind it (a crash, a
failure: the peers stand still) is switched to at once, as is one that arrives while no run is going.

**Leaving.** SIGTERM makes the daemon announce "leaving" at once, but it keeps training and serving its
state until the coordinator's new plan, which no longer places it, is under way: the new plan's peers
reported a step past its start, so every one of them holds its state. It does not wait when it has
nothing to hand over (not placed when the leave began), when the job is done, when no other peer is
left to take over, or once ``timeout_s`` has passed (a coordinator that never re-plans).
"""

from __future__ import annotations

from dataclasses import dataclass

SWITCH_WAIT_S = 60.0  # least seconds a peer trains on toward a plan's start step before switching anyway
SWITCH_WAIT_STEPS = 3.0  # ... or this many times the steps still to go at the last step's pace


def switch_verdict(start_step: int, at: int | None, running: bool) -> tuple[str, str]:
    """("switch" | "train on", why) for a new plan starting at ``start_step`` while the run of the old
    one stands at ``at`` (steps done; None before its first step) and is ``running`` or not."""
    if not running:
        return "switch", "no run under the old plan"
    if at is None:
        return "switch", "the old run has not completed a step"
    if at >= start_step:
        return "switch", f"the old run stands at step {at}, at or past the new start {start_step}"
    return "train on", f"training on to step {start_step} under the old plan (at step {at})"


def switch_deadline(now: float, start_step: int, at: int, step_s: float) -> float:
    """Monotonic time after which a peer stops waiting to reach ``start_step`` and switches anyway."""
    return now + max(SWITCH_WAIT_S, SWITCH_WAIT_STEPS * (start_step - at) * max(step_s, 0.0))


@dataclass(frozen=True)
class LeaveView:
    """What a leaving peer knows, read afresh each time it decides."""

    since: float  # monotonic seconds when the leave began
    placed_at_start: bool  # the plan followed when the leave began placed this peer
    placed: bool  # the newest plan this peer knows (followed or about to be) places it
    running: bool  # a training run of this peer is still going (it trains on toward a hand-off step)
    under_way: bool  # the newest plan's peers reported a step past its start: they hold the state
    done: bool  # the job is done
    others: int  # live peers other than this one


def leave_verdict(view: LeaveView, now: float, timeout_s: float) -> tuple[str, str]:
    """("go" | "wait", why) for a peer asked to leave, at monotonic time ``now``."""
    waited = now - view.since
    if view.done:
        return "go", "the job is done"
    if not view.placed_at_start:
        return "go", "nothing to hand over: this peer was not placed"
    if view.others == 0:
        return "go", "no other live peer to hand this peer's work to"
    if waited >= timeout_s:
        return "go", f"the hand-off did not complete within {timeout_s:.0f} s"
    if view.placed:
        return "wait", "waiting for the coordinator to re-plan without this peer"
    if view.running:
        return "wait", "training on to the new plan's start step"
    if view.under_way:
        return "go", "hand-off complete: the new plan is training"
    return "wait", "serving this peer's state until the new plan's peers hold it"
