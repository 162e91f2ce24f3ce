"""The coordinator's seams: the job kind handed in, its events, and one view of what it knows."""

import logging

import pytest

from potluck.classpar.swarm.service import ClassParJob
from potluck.coordinator.config import CoordinatorConfig
from potluck.coordinator.errors import CoordinatorError
from potluck.coordinator.events import Events, PeersChanged, PlanPublished
from potluck.coordinator.pipeline import PipelineJob
from potluck.coordinator.service import CoordinatorService
from potluck.coordinator.state import SwarmState
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import parse_job
from tests.unit.coordinator.job.test_plan import JOB

CLASSPAR = parse_job(
    {
        "name": "cp",
        "kind": "class_parallel",
        "model": {"n_layers": 1, "d_model": 8, "n_heads": 1, "vocab_size": 2, "seq_len": 2},
        "batch": {"tokens_per_step": 2, "micro_batch_size": 1},
        "class_parallel": {},
    }
)


def service(job=JOB, **kw) -> CoordinatorService:
    return CoordinatorService(CoordinatorConfig(swarm_id="s"), job, Identity.generate(), **kw)


def test_the_pipeline_kind_is_built_in_and_other_kinds_are_handed_in():
    assert isinstance(service().driver, PipelineJob)
    with pytest.raises(CoordinatorError, match="class_parallel job"):
        service(CLASSPAR)  # nobody handed this coordinator the class-parallel kind
    svc = service(CLASSPAR, kinds={"class_parallel": ClassParJob})
    assert isinstance(svc.driver, ClassParJob) and svc.plan is None and svc.throughput() is None


def test_a_failing_subscriber_is_logged_and_the_others_still_hear_the_event(caplog):
    events, heard = Events(), []

    def broken(event: object) -> None:
        raise RuntimeError("a watcher's bug")

    events.subscribe(broken)
    events.subscribe(heard.append)
    state = SwarmState("s", 1.0)
    with caplog.at_level(logging.ERROR):
        events.emit(PeersChanged(state, ["a"], []))
    assert heard == [PeersChanged(state, ["a"], [])]
    assert "event subscriber failed on PeersChanged" in caplog.text


def test_the_moment_is_what_the_service_knows_now():
    svc = service()
    m = svc.moment()
    assert (m.job, m.plan, m.finished, m.error, m.jobs) == (JOB, None, False, None, {})
    assert m.rate is not None and m.rate.tokens_per_s == 0.0 and m.rate.step == 0
    svc.last_reason, svc.error = "why", "gone"
    svc.finished.set()
    assert (svc.moment().reason, svc.moment().error, svc.moment().finished) == ("why", "gone", True)


def test_the_job_view_shows_the_services_figure(tmp_path):
    from potluck.cli.views.job import JobWatcher
    from tests.unit.coordinator.job.test_progress import PLAN

    svc = service()
    assert isinstance(svc.driver, PipelineJob)
    watcher = JobWatcher(JOB, tmp_path, svc.throughput)
    svc.events.subscribe(watcher.handle)
    svc.events.emit(PlanPublished(PLAN, "first"))
    svc.driver.rate.observe(1, 0.0)
    svc.driver.rate.observe(11, 2.0)
    assert watcher.plan == PLAN
    assert watcher.tokens_per_s == svc.throughput().tokens_per_s == 5 * JOB.batch.tokens_per_step  # type: ignore[union-attr]
