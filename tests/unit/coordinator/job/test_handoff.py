"""The start step of a re-plan nobody had to stop for (pure)."""

from potluck.coordinator.job.handoff import DEFAULT_STEP_S, handoff_step, typical_step_s
from potluck.protocol.identity import Identity
from potluck.protocol.training import Progress, StepTiming

PEER = Identity.generate().peer_id


def rec(total: float, state: str = "training") -> Progress:
    return Progress(
        peer_id=PEER,
        job="t",
        epoch=1,
        stage=0,
        replica=0,
        step=5,
        state=state,  # type: ignore[arg-type]
        timing=StepTiming(total=total),
        issued_at=1.0,
    )


def test_starts_ahead_by_the_lead_time_in_steps_and_leaves_the_last_step_to_the_new_plan():
    start, why = handoff_step(40, 0.5, 4.0, 1000)
    assert start == 40 + 8 + 1 and "hand-off at step 49" in why
    assert handoff_step(40, 10.0, 4.0, 1000)[0] == 42  # slow steps: still at least one ahead
    assert handoff_step(995, 0.5, 4.0, 1000)[0] == 999  # the new plan runs the last step
    assert handoff_step(1000, 0.5, 4.0, 1000)[0] == 1000
    assert handoff_step(0, 1e-6, 4.0, 10**9)[0] == 1000  # capped


def test_with_local_steps_the_hand_off_waits_for_a_sync():
    """Between DiLoCo syncs the replicas' weights differ: the old plan's peers stop at a sync."""
    assert handoff_step(40, 0.5, 4.0, 1000, sync_every=16)[0] == 64  # 49 rounded up to a multiple of 16
    assert handoff_step(48, 10.0, 4.0, 1000, sync_every=16)[0] == 64
    assert handoff_step(990, 0.5, 4.0, 1000, sync_every=16)[0] == 1000  # the old plan syncs at the end
    assert handoff_step(40, 0.5, 4.0, 1000, sync_every=1)[0] == 49


def test_typical_step_is_the_median_of_training_peers():
    assert typical_step_s([rec(1.0), rec(3.0), rec(2.0), rec(9.0, "failed")]) == 2.0
    assert typical_step_s([]) == DEFAULT_STEP_S and typical_step_s([], default=0.0) == 0.0
