"""The start step of a new epoch (pure): the coordinator's own checkpoint, the peers' reports, the cap."""

import pytest

from potluck.coordinator.job.progress import JobProgress
from potluck.coordinator.job.resume import (
    ResumePoint,
    checkpoint_step,
    live_step,
    resume_point,
    start_holders,
    unheard_survivors,
)
from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.training import Holding, Progress, StageAssignment, TrainPlan
from tests.unit.coordinator.job.test_plan import JOB


def on_disk(step: int, **changes: object) -> StageMeta:
    fields: dict[str, object] = {
        "job": JOB.name,
        "step": step,
        "stage": 0,
        "n_stages": 2,
        "first_layer": 0,
        "last_layer": 2,
        "model": JOB.model,
        "seed": JOB.seed,
        "tokenizer": None,
        "epoch": 3,
    }
    return StageMeta(**{**fields, **changes})  # type: ignore[arg-type]


def test_nothing_to_resume_from_starts_at_zero():
    point = resume_point(JOB, None, 0)
    assert point == ResumePoint(0, point.reason) and "seeded init" in point.reason


def test_the_newer_witness_wins():
    assert resume_point(JOB, on_disk(20), 10).step == 20
    point = resume_point(JOB, on_disk(10), 30)
    assert point.step == 30 and "reported" in point.reason and point.ignored is None
    point = resume_point(JOB, None, 40)
    assert point.step == 40 and "reported" in point.reason
    point = resume_point(JOB, on_disk(20), 20)
    assert point.step == 20 and "disk" in point.reason


def test_a_checkpoint_past_the_last_step_is_capped():
    assert resume_point(JOB, on_disk(JOB.steps + 50), 0).step == JOB.steps


def test_another_jobs_or_models_checkpoint_is_never_resumed_from():
    other_job = resume_point(JOB, on_disk(50, job="other"), 0)
    assert other_job.step == 0 and other_job.ignored is not None and "another job" in other_job.ignored
    other_model = JOB.model.model_copy(update={"seq_len": JOB.model.seq_len * 2})
    point = resume_point(JOB, on_disk(50, model=other_model), 10)
    assert point.step == 10 and point.ignored is not None and "another model" in point.ignored


def test_a_negative_report_is_a_bug():
    with pytest.raises(ValueError, match="reported"):
        resume_point(JOB, None, -1)


def pid(name: str) -> str:
    return f"12D3KooW{name * 16}"  # peer ids are at least 16 characters


def _plan(stages: list[str], start: int = 0, epoch: int = 2) -> TrainPlan:
    """``stages``: one string per stage, one letter per replica's peer."""
    return TrainPlan(
        job=JOB.name,
        epoch=epoch,
        start_step=start,
        micro_batches=2,
        issued_at=1.0,
        stages=[
            StageAssignment(first_layer=j, last_layer=j + 1, peers=[pid(c) for c in p])
            for j, p in enumerate(stages)
        ],
    )


def live(names: str) -> set[str]:
    return {pid(c) for c in names}


def _report(peer: str, step: int, epoch: int = 2, state: str = "training") -> Progress:
    return Progress(
        peer_id=pid(peer),
        job=JOB.name,
        epoch=epoch,
        stage=0,
        replica=0,
        step=step,
        state=state,
        issued_at=1.0,
    )  # type: ignore[arg-type]


def test_live_state_is_the_newest_step_a_live_placed_peer_reported():
    plan = _plan(["ab", "cd"], start=10)
    latest = {
        pid(p): _report(p, s, state=st)
        for p, s, st in (("a", 17, "training"), ("b", 18, "failed"), ("c", 16, "training"))
    }
    latest[pid("b")] = latest[pid("b")].model_copy(
        update={"holds": Holding(step=18, first_layer=0, last_layer=1)}
    )
    assert live_step(plan, latest, live("abc")) == 18  # d died; b failed at step 18, exactly
    assert live_step(plan, latest, live("ac")) == 17  # what the living reported
    assert live_step(plan, {}, live("ac")) is None  # nobody reported yet: nothing is known held
    known = {pid("a"): Holding(step=10, first_layer=0, last_layer=1)}
    known[pid("c")] = Holding(step=10, first_layer=1, last_layer=2)
    assert live_step(plan, {}, live("ac"), known) == 10  # what they held when the plan began


def test_with_local_steps_live_state_is_the_last_sync_the_peers_hold_not_their_step():
    """Between DiLoCo syncs a running peer serves its last sync (``Trainer.held_step``), and says so in
    ``holds``: a kill at step 27 with H = 16 resumes from 16, which every survivor can serve."""
    plan = _plan(["ab", "cd"], start=0)

    def at(peer: str, step: int, held: int, state: str = "training") -> Progress:
        stage = "ab".find(peer) < 0
        holds = Holding(step=held, first_layer=int(stage), last_layer=int(stage) + 1)
        return _report(peer, step, state=state).model_copy(update={"holds": holds})

    latest = {pid("a"): at("a", 27, 16), pid("c"): at("c", 27, 16, "failed"), pid("d"): at("d", 26, 16)}
    assert live_step(plan, latest, live("acd")) == 16
    latest[pid("a")] = at("a", 27, 27)  # a peer without local steps holds the step it committed
    latest[pid("c")] = at("c", 27, 27, "failed")
    assert live_step(plan, latest, live("acd")) == 27


def test_the_holders_of_a_start_step_are_the_live_peers_reporting_its_layers():
    """``TrainPlan.holders``: a piece kept from an older layer cut (``also_holds``) is named too."""
    known = {
        pid("a"): Holding(step=816, first_layer=0, last_layer=3),
        pid("b"): Holding(step=736, first_layer=0, last_layer=3),
        pid("e"): Holding(step=736, first_layer=0, last_layer=4),  # not live
    }
    also = {pid("a"): [Holding(step=736, first_layer=3, last_layer=4)], pid("c"): []}
    got = start_holders(736, live("abc"), known, also)
    assert [(h.peer_id, h.first_layer, h.last_layer) for h in got] == [(pid("b"), 0, 3), (pid("a"), 3, 4)]
    assert start_holders(900, live("abc"), known, also) == []


def test_a_stage_without_a_live_replica_has_no_live_state():
    plan = _plan(["ab", "cd"], start=10)
    latest = {pid(p): _report(p, 15) for p in "abcd"}
    assert live_step(plan, latest, live("ab")) is None
    stale = {pid("a"): _report("a", 99, epoch=1), pid("c"): _report("c", 15)}
    assert live_step(plan, stale, live("ac")) == 15  # a report of another epoch does not count


def test_live_state_beats_checkpoints_and_is_capped():
    point = resume_point(JOB, on_disk(10), 10, live=23)
    assert point.step == 23 and "live replica" in point.reason
    assert resume_point(JOB, on_disk(10), 10, live=None).step == 10  # no live state: checkpoints
    assert resume_point(JOB, None, 0, live=0).step == 0
    assert resume_point(JOB, None, 0, live=JOB.steps + 50).step == JOB.steps


def _holding(peer: str, step: int, first: int, last: int, state: str = "failed") -> Progress:
    rec = _report(peer, 10, state=state)
    return rec.model_copy(update={"holds": Holding(step=step, first_layer=first, last_layer=last)})


def test_live_state_must_cover_every_layer_at_one_step():
    """The reproduction of a lost stage: a re-plan put the two survivors of stage 0 (layers [0, 1)) into
    both stages; their runs failed before taking the plan's state, and they report what they hold."""
    plan = _plan(["a", "b"], start=10)
    latest = {pid("a"): _holding("a", 38, 0, 1), pid("b"): _holding("b", 38, 0, 1)}
    assert live_step(plan, latest, live("ab")) is None  # nobody holds layer 1: no live resume
    latest[pid("b")] = _holding("b", 38, 1, 2)  # had b held layer 1 at the same step, it would do
    assert live_step(plan, latest, live("ab")) == 38
    latest[pid("b")] = _holding("b", 37, 1, 2)  # but not at another step
    assert live_step(plan, latest, live("ab")) is None


def test_peers_running_the_plan_hold_the_step_their_pipeline_committed():
    plan = _plan(["ab", "cd"], start=10)
    latest = {
        pid("a"): _holding("a", 17, 0, 1, "training"),
        pid("c"): _holding("c", 16, 1, 2, "training"),  # its report lags one step behind a's
    }
    assert live_step(plan, latest, live("ac")) == 17
    latest[pid("c")] = _holding("c", 40, 0, 1)  # c holds other layers (its run failed before taking)
    assert live_step(plan, latest, live("ac")) is None


def test_checkpoints_count_only_where_a_live_peer_keeps_them():
    stored = {
        pid("a"): [Holding(step=30, first_layer=0, last_layer=2)],
        pid("b"): [Holding(step=30, first_layer=2, last_layer=4)],
        pid("c"): [
            Holding(step=20, first_layer=2, last_layer=4),
            Holding(step=20, first_layer=0, last_layer=2),
        ],
    }
    assert checkpoint_step(stored, live("abc"), 4) == 30
    assert checkpoint_step(stored, live("ac"), 4) == 20  # b's disk is gone: c's copy of step 20 serves
    assert checkpoint_step(stored, live("a"), 4) == 0  # nobody keeps layers [2, 4)
    assert checkpoint_step({}, live("abc"), 4) == 0


def test_a_failed_peer_of_its_own_stage_shows_how_far_the_pipeline_got():
    """Reports lag: the running replicas last said 1440, the peer whose step then failed holds 1444 of its
    own stage, so the pipeline committed 1444 and every running peer holds it."""
    plan = _plan(["ab", "cd"], start=1248, epoch=5)
    latest = {
        pid("a"): _holding("a", 1440, 0, 1, "training"),
        pid("c"): _holding("c", 1444, 1, 2, "failed"),  # d died; c's step failed without it
    }
    latest = {p: r.model_copy(update={"epoch": 5}) for p, r in latest.items()}
    assert live_step(plan, latest, live("ac")) == 1444


def test_what_peers_held_under_a_failed_plan_is_not_forgotten():
    """The stall measured in the churn benchmark: a plan started behind the survivors' step, failed at
    once, and the next plan's peers had not reported when the coordinator re-planned. Their newest
    holdings (any epoch) keep live state in view; without them the swarm fell back to step 0."""
    plan = _plan(["ab", "cd"], start=0, epoch=13)  # the failed plan, nobody reported under it yet
    known = {
        pid("a"): Holding(step=1700, first_layer=0, last_layer=1),
        pid("c"): Holding(step=1700, first_layer=1, last_layer=2),
    }
    assert live_step(plan, {}, live("abcd"), known) == 1700
    assert live_step(plan, {}, live("abd"), known) is None  # c's holding is gone with c
    known[pid("c")] = Holding(step=1699, first_layer=1, last_layer=2)
    assert live_step(plan, {}, live("abcd"), known) is None  # no step at which both stages are held


def test_a_hand_off_start_the_old_plan_never_reached_is_not_held():
    """A hand-off plan starts ahead (step 623); a kill stopped the old plan at 523. Peers that have not
    reported under the new plan hold 523, not 623."""
    plan = _plan(["ab", "cd"], start=623, epoch=2)
    known = {pid(c): Holding(step=523, first_layer=i, last_layer=i + 1) for i, c in ((0, "a"), (1, "c"))}
    assert live_step(plan, {}, live("abc"), known) == 523


def test_wider_layers_a_moved_peer_still_serves_keep_live_state_in_view():
    """Measured in the churn benchmark: a plan cut layers 0-1 / 2-3 into 0 / 1-3; the peer that held
    0-1 took layer 0 for the new plan (its report now says 0-0), the plan failed before anyone took
    layer 1, and the coordinator restarted the job from step 0. The peer still serves 0-1 (also_holds)."""
    plan = _plan(["ab", "cd"], start=1819, epoch=6)  # layers 0 | 1
    narrow = {pid("a"): Holding(step=1819, first_layer=0, last_layer=1)}
    wide = {pid("a"): [Holding(step=1819, first_layer=0, last_layer=2)]}
    assert live_step(plan, {}, live("a"), narrow) is None
    assert live_step(plan, {}, live("a"), narrow, wide) == 1819
    assert live_step(plan, {}, live("c"), narrow, wide) is None  # a is gone, and with it what it held


def test_a_newer_checkpoint_beats_an_older_live_state():
    """Spares may still serve the state they held when they were placed, long ago."""
    assert resume_point(JOB, on_disk(40), 0, live=23).step == 40
    assert resume_point(JOB, None, 40, live=23).from_checkpoint
    assert resume_point(JOB, None, 40, live=40).from_checkpoint is False  # a tie: live, no disk read


def test_a_placed_peer_whose_run_failed_holding_nothing_holds_nothing():
    """Churn run C: the leader died inside a commit; stage 1 (layers 1-3) applied step 3228, the other
    stage-0 replica held 3227. The plan from 3228 failed: its new stage-0 leader could take [0, 3) from
    nobody. The coordinator counted that leader, failed and holding nothing, as running its stage at
    3228 and re-planned from 3228 three times."""
    plan = _plan(["nb", "cd"], start=3228, epoch=10)
    latest = {
        pid("n"): _report("n", 3228, epoch=10, state="failed"),  # took nothing: holds None
        pid("b"): _holding("b", 3227, 0, 1).model_copy(update={"epoch": 10}),
        pid("c"): _holding("c", 3228, 1, 2).model_copy(update={"epoch": 10}),
        pid("d"): _holding("d", 3228, 1, 2).model_copy(update={"epoch": 10}),
    }
    assert live_step(plan, latest, live("nbcd")) is None  # no step has every layer: older state it is
    latest[pid("b")] = _holding("b", 3228, 0, 1).model_copy(update={"epoch": 10})  # had b applied it
    assert live_step(plan, latest, live("nbcd")) == 3228


def test_a_repair_waits_for_the_survivors_that_have_not_said_where_their_run_ended():
    """Churn runs B and C: repairs read the survivors' last reports (a second of steps stale) and
    started behind them; their "failed" records, sent 0.05 s after the kill, say exactly where."""
    plan = _plan(["ab", "cd"], start=100, epoch=4)
    progress = JobProgress()
    running = [_report(p, 160, epoch=4) for p in "abcd"]
    progress.update(plan, running)
    assert unheard_survivors(plan, progress, live("abc")) == [pid("a"), pid("b"), pid("c")]  # d died
    progress.update(
        plan, [_report("a", 167, epoch=4, state="failed"), _report("b", 167, epoch=4, state="failed")]
    )
    assert unheard_survivors(plan, progress, live("abc")) == [pid("c")]
    progress.update(plan, [_report("c", 167, epoch=4, state="failed")])
    assert unheard_survivors(plan, progress, live("abc")) == []
    fresh = JobProgress()  # a plan that never committed a step: its peers hold its start, no wait
    fresh.update(plan, [_report(p, 100, epoch=4) for p in "abc"])
    assert unheard_survivors(plan, fresh, live("abc")) == []
