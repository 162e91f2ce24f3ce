"""The start step of a new epoch (pure): the coordinator's own checkpoint, the peers' reports, the cap."""

import pytest

from potluck.coordinator.job.resume import ResumePoint, resume_point
from potluck.protocol.checkpoints import StageMeta
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
