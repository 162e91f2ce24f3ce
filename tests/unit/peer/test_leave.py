"""A peer's part in a re-plan nobody stopped for: when to switch plans, when a leave may end (pure)."""

from potluck.peer.leave import SWITCH_WAIT_S, LeaveView, leave_verdict, switch_deadline, switch_verdict


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
