"""A peer's part in a re-plan nobody stopped for: when to switch plans, when a leave may end (pure), and
when a plan behind this peer is worth reporting."""

import asyncio
from types import SimpleNamespace

from potluck.peer.leave import SWITCH_WAIT_S, LeaveView, leave_verdict, switch_deadline, switch_verdict
from potluck.peer.replans import Replans
from potluck.protocol.training import StageAssignment, TrainPlan


def view(**kw: object) -> LeaveView:
    base = dict(
        since=100.0, placed_at_start=True, placed=False, running=False, under_way=False, done=False, others=2
    )
    return LeaveView(**(base | kw))  # type: ignore[arg-type]


def test_a_plan_starting_ahead_is_trained_toward_one_at_or_behind_is_switched_to_at_once():
    assert switch_verdict(50, 40, True)[0] == "train on"
    assert switch_verdict(50, 50, True)[0] == "switch"  # a crash: the peers stand at the start
    assert switch_verdict(50, 55, True)[0] == "switch"
    assert switch_verdict(50, 40, False)[0] == "switch"  # no run going
    assert switch_verdict(50, None, True)[0] == "switch"  # the run never stepped
    assert switch_deadline(0.0, 50, 40, 0.1) == SWITCH_WAIT_S
    assert switch_deadline(0.0, 50, 40, 10.0) == 300.0


def test_a_leave_waits_for_the_new_plan_to_be_under_way():
    t = 110.0
    assert leave_verdict(view(placed=True), t, 60.0) == (
        "wait",
        "waiting for the coordinator to re-plan without this peer",
    )
    assert leave_verdict(view(running=True), t, 60.0)[0] == "wait"
    assert leave_verdict(view(), t, 60.0)[1].startswith("serving this peer's state")
    assert leave_verdict(view(under_way=True), t, 60.0) == (
        "go",
        "hand-off complete: the new plan is training",
    )


def test_a_leave_is_quick_when_nothing_is_to_hand_over_and_bounded_otherwise():
    assert leave_verdict(view(placed_at_start=False, placed=False), 100.0, 60.0)[0] == "go"
    assert leave_verdict(view(placed=True, done=True), 100.0, 60.0)[0] == "go"
    assert leave_verdict(view(placed=True, others=0), 100.0, 60.0)[0] == "go"
    decision, why = leave_verdict(view(placed=True), 160.0, 60.0)
    assert decision == "go" and "within 60 s" in why


def test_a_plan_behind_this_peer_is_reported_only_when_it_claims_live_state() -> None:
    """``Replans._overshot``: a live start behind the step this peer holds came from stale reports (say
    so); a start from a checkpoint or the seeded init is the coordinator's choice (a stage lost every
    replica), and reporting it would only fail the plan."""
    published: list[dict[str, object]] = []

    class Peer(Replans):
        async def _publish(self, *args: object, **kw: object) -> None:  # type: ignore[override]
            published.append(kw)

    me = "12D3KooWAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    peer = Peer()
    peer.peer_id = me
    peer.state = SimpleNamespace(offered=SimpleNamespace(meta=SimpleNamespace(job="j", step=150)))  # type: ignore[assignment]

    def plan(start: int, resume_from: str = "live", behind: int | None = None) -> TrainPlan:
        stages = [StageAssignment(first_layer=0, last_layer=2, peers=[me])]
        return TrainPlan(
            job="j",
            epoch=3,
            start_step=start,
            micro_batches=1,
            issued_at=1.0,
            stages=stages,
            resume_from=resume_from,
            behind=behind,
        )  # type: ignore[arg-type]

    assert asyncio.run(peer._overshot(plan(120))) and published[-1]["state"] == "failed"
    assert not asyncio.run(peer._overshot(plan(0)))  # the seeded init: nothing holds every stage
    assert not asyncio.run(peer._overshot(plan(100, "checkpoint")))
    assert not asyncio.run(peer._overshot(plan(150)))  # not behind
    # the coordinator knew of step 150 and that another stage's layers of it are lost (churn run X)
    assert not asyncio.run(peer._overshot(plan(120, behind=150)))
    assert asyncio.run(peer._overshot(plan(120, behind=140)))  # 150 is news to it
    assert len(published) == 2
