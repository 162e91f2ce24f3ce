"""The job-kind seam of the coordinator: what a kind of job runs inside the coordinator service.

``CoordinatorService`` owns what every job needs from its swarm: the DHT node, the signed job record,
the peers it may use (``state``), admission, the allocator, the owner's checkpoint copy, memory for a
restart, events. A ``JobDriver`` owns one kind's lifecycle on top: "pipeline" (``pipeline.py``, built
in) plans stages and replicas and re-plans under churn; other kinds are handed in by the CLI
(``classpar.swarm.service.ClassParJob`` for "class_parallel"), so the service core never names them.
A driver sees the service only through ``JobHost``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Protocol

from potluck.coordinator.admission import AdmissionDesk
from potluck.coordinator.config import CoordinatorConfig
from potluck.coordinator.copies import OwnerCopy
from potluck.coordinator.events import Events
from potluck.coordinator.job.progress import JobProgress
from potluck.coordinator.state import SwarmState
from potluck.net.node import SwarmNode
from potluck.protocol.allocation import Allocation
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.invite import Invite
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import JobKeys
from potluck.protocol.training import TrainPlan
from potluck.telemetry.summary import JobRate


class JobHost(Protocol):
    """What a job kind's driver may use of the coordinator service."""

    cfg: CoordinatorConfig
    job: JobSpec
    join: Invite | None  # set when the job was added to someone else's swarm (launch --join)
    keys: JobKeys
    node: SwarmNode | None
    policy: TrustPolicy
    desk: AdmissionDesk
    swarm: SwarmState  # every live peer
    state: SwarmState  # the peers this job may use
    allocation: Allocation | None
    owner: OwnerCopy | None
    events: Events
    finished: asyncio.Event
    error: str | None
    last_reason: str
    first_epoch: int

    @property
    def checkpoint_root(self) -> Path: ...

    def ban(self, peer: str, why: str) -> None: ...

    async def read_state(self) -> SwarmState: ...


class JobDriver(Protocol):
    """One kind's lifecycle inside the service."""

    @property
    def plan(self) -> TrainPlan | None:
        """The pipeline plan in force (what peers' leases and restarts read); None for other kinds."""

    @property
    def progress(self) -> JobProgress:
        """The job's progress as its peers report it (empty for kinds that report none)."""

    @property
    def rate(self) -> JobRate | None:
        """The job's throughput (``telemetry.summary``); None for kinds that take no steps."""

    async def recover(self, saved: TrainPlan | None, joined: bool) -> None:
        """After a restart (``joined``: the swarm was found): carry on with what the swarm follows."""

    def loops(self) -> dict[str, Coroutine[Any, Any, None]]:
        """The kind's named loops, supervised with the service's own."""


KindFactory = Callable[[JobHost], JobDriver]
JobKinds = Mapping[str, KindFactory]
