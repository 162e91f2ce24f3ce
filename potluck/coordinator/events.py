"""What the coordinator tells those who watch it: events as they happen, and a ``Moment`` on demand.

The service emits an event when peers join or leave, when it publishes a plan and when it reads fresh
progress; a job kind may emit its own (class-parallel plans). Watchers (the launch and demo views, a
kind's printer) ``subscribe`` a callback and pick the events they care about by type. A callback that
raises is logged and never stops the service. ``Moment`` is everything the coordinator knows at one look
(``CoordinatorService.moment()``): telemetry and the dashboard read it instead of reaching into the
service.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from potluck.coordinator.job.progress import JobProgress
from potluck.coordinator.state import SwarmState
from potluck.protocol.allocation import Allocation
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import TrainPlan
from potluck.telemetry.summary import Throughput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeersChanged:
    """The peers this job may use changed: ``joined`` and ``left`` (peer ids) since the last read."""

    state: SwarmState
    joined: list[str]
    left: list[str]


@dataclass(frozen=True)
class PlanPublished:
    """A pipeline plan was published: a new epoch, or the same one re-published (spares, a pause)."""

    plan: TrainPlan
    reason: str


@dataclass(frozen=True)
class ProgressRead:
    """Fresh progress records of the plan in force were read."""

    plan: TrainPlan
    progress: JobProgress


Callback = Callable[[object], None]


class Events:
    """Subscribers called in order for each event, on the service's loop."""

    def __init__(self) -> None:
        self._subscribers: list[Callback] = []

    def subscribe(self, callback: Callback) -> None:
        self._subscribers.append(callback)

    def emit(self, event: object) -> None:
        for callback in self._subscribers:
            try:
                callback(event)
            except Exception:  # a watcher's bug must not stop the job
                logger.exception("event subscriber failed on %s", type(event).__name__)


@dataclass(frozen=True)
class JobLoad:
    """A job as the allocator last saw it: its weight, step and last step."""

    weight: float
    step: int
    steps: int


@dataclass(frozen=True)
class Moment:
    """What the coordinator knew at one look (the input of ``swarm_status`` and ``swarm_events``)."""

    job: JobSpec
    plan: TrainPlan | None
    progress: JobProgress
    state: SwarmState
    reason: str
    finished: bool
    error: str | None
    allocation: Allocation | None = None  # the leases in force (several jobs on one swarm)
    jobs: dict[str, JobLoad] = field(default_factory=dict)  # the jobs the allocator knows, by name
    rate: Throughput | None = None  # the job's tokens/s and ETA (``telemetry.summary``)
