"""What a restarted coordinator carries on with (pure): the live plan, its progress, and epochs that only
grow whatever the witnesses say."""

from potluck.coordinator.job.recover import recover
from potluck.protocol.training import Progress, StageAssignment, TrainPlan
from tests.unit.coordinator.job.test_plan import ids

JOB = "t"
P = ids(4)


def plan(epoch: int, job: str = JOB, status: str = "training", start: int = 0) -> TrainPlan:
    return TrainPlan(
        job=job,
        epoch=epoch,
        status=status,  # type: ignore[arg-type]
        start_step=start,
        micro_batches=1,
        issued_at=float(epoch),
        stages=[
            StageAssignment(first_layer=0, last_layer=2, peers=P[:2]),
            StageAssignment(first_layer=2, last_layer=4, peers=P[2:]),
        ],
    )


def rec(peer: int, step: int, epoch: int, job: str = JOB, ckpt: int | None = None) -> Progress:
    return Progress(
        peer_id=P[peer],
        job=job,
        epoch=epoch,
        stage=peer // 2,
        replica=peer % 2,
        step=step,
        checkpoint_step=ckpt,
        issued_at=float(step),
    )


def test_a_new_job_starts_at_epoch_one():
    r = recover(JOB, [], [])
    assert r.plan is None and r.next_epoch == 1 and "new job" in r.reason


def test_the_live_plan_and_its_progress_are_carried_on():
    live = plan(3, start=10)
    records = [rec(i, 20 + i, 3, ckpt=20) for i in range(4)] + [rec(0, 99, 2)]  # epoch 2: not counted
    r = recover(JOB, [live], records)
    assert r.plan == live and r.next_epoch == 4 and not r.from_saved
    assert r.progress.step(live) == 20 and r.progress.best_step == 20
    assert r.progress.complete_checkpoint() == 20
    assert "epoch 3" in r.reason and "step 20" in r.reason and "DHT" in r.reason


def test_the_saved_plan_stands_in_for_an_expired_record_and_the_newer_one_wins():
    saved = plan(2)
    r = recover(JOB, [], [rec(0, 5, 2)], saved)
    assert r.plan == saved and r.from_saved and r.next_epoch == 3 and "saved" in r.reason
    r = recover(JOB, [plan(4)], [], saved)  # the DHT holds a newer epoch than we saved
    assert r.plan is not None and r.plan.epoch == 4 and not r.from_saved and r.next_epoch == 5
    r = recover(JOB, [plan(2)], [], plan(5))  # we saved a newer one than the DHT answered with
    assert r.plan is not None and r.plan.epoch == 5 and r.from_saved


def test_peers_on_a_newer_epoch_make_the_readable_plan_stale():
    r = recover(JOB, [plan(3)], [rec(0, 7, 4)])
    assert r.plan is None and r.next_epoch == 5 and "older than epoch 4" in r.reason


def test_epochs_of_another_job_still_push_the_next_epoch_up():
    # The plan key holds one value: planning epoch 1 under it would be ignored by peers on epoch 6.
    r = recover(JOB, [plan(6, job="other")], [rec(1, 3, 6, job="other")])
    assert r.plan is None and r.next_epoch == 7 and "epochs seen up to 6" in r.reason
    r = recover(JOB, [], [rec(1, 3, 2)])  # no plan readable at all, but peers follow epoch 2
    assert r.plan is None and r.next_epoch == 3


def test_a_finished_job_plans_anew_above_its_done_epoch():
    r = recover(JOB, [plan(5, status="done")], [rec(0, 100, 4)])
    assert r.plan is None and r.next_epoch == 6 and "finished" in r.reason
