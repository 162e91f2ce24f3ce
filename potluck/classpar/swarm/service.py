"""The class-parallel job kind inside the coordinator (docs/class-parallel.md): ``CoordinatorService``
keeps the swarm's entry point, admission desk and peer tracking; this driver (``coordinator/kinds.py``)
runs the class-parallel loop in place of the pipeline's (``plan.py`` decides; this publishes the
``ClassParPlan`` and keeps it fresh; ``check.py`` measures each sub-network a holder names before the
plan counts it as held). ``potluck launch`` hands it to the service for ``kind = "class_parallel"``.

The job does not end by itself: once every coded worker is held the plan says "serving" and the
coordinator stays up as the swarm's entry point while ``potluck serve`` clients query the holders; it
re-deals the workers of a peer that leaves. Ctrl-C (SIGTERM) stops it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from hivemind.utils import get_dht_time

from potluck.classpar.folder import folder_digest
from potluck.classpar.swarm.check import SubnetChecker
from potluck.classpar.swarm.plan import next_plan
from potluck.coordinator.job.plan import device_of
from potluck.coordinator.job.progress import JobProgress
from potluck.coordinator.kinds import JobHost
from potluck.net.dial import dht_addresses
from potluck.net.streams import Streams
from potluck.protocol.classpar import ClassParPlan, ClassParSubnet, ClassParTeacher
from potluck.protocol.errors import JobSpecError
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import TrainPlan
from potluck.telemetry.summary import JobRate

logger = logging.getLogger(__name__)


def with_data_digest(job: JobSpec) -> JobSpec:
    """``job`` with the SHA-256 of the owner's image folder in its class-parallel section (peers refuse a
    copy that differs); unchanged for the procedural set or when the file names one already."""
    spec = job.class_parallel
    if spec is None or job.data.source != "directory" or spec.data_sha256 is not None:
        return job
    assert job.data.path is not None  # DataSpec requires it for a directory
    digest = folder_digest(job.data.path)
    logger.info("image folder %s: sha256 %s", job.data.path, digest[:12])
    return job.model_copy(update={"class_parallel": spec.model_copy(update={"data_sha256": digest})})


@dataclass(frozen=True)
class ClassParPlanPublished:
    """An event (``coordinator/events.py``): a class-parallel plan was published."""

    plan: ClassParPlan
    reason: str


class ClassParJob:
    """The "class_parallel" kind's driver, on a swarm of its own."""

    def __init__(self, host: JobHost) -> None:
        if host.job.kind != "class_parallel":
            raise JobSpecError(f"job {host.job.name} is a {host.job.kind} job, not a class-parallel one")
        if host.join is not None:
            raise JobSpecError("a class-parallel job runs on a swarm of its own (launch without --join)")
        self.host = host
        self.classpar: ClassParPlan | None = None
        self.checker: SubnetChecker | None = None  # the sub-networks' accuracy check (check.py)
        self._progress = JobProgress()  # no pipeline progress: the plan's status says where it is

    @property
    def plan(self) -> TrainPlan | None:
        return None

    @property
    def progress(self) -> JobProgress:
        return self._progress

    @property
    def rate(self) -> JobRate | None:
        return None

    def loops(self) -> dict[str, Coroutine[Any, Any, None]]:
        return {"run-job": self._run_job(), "refresh-plan": self._refresh_plan()}

    async def recover(self, saved: TrainPlan | None, joined: bool) -> None:
        """A restarted coordinator carries on with the plan the swarm holds (the same groups: they are
        seeded), from its epoch."""
        host = self.host
        assert host.node is not None
        try:
            found = [v.record for v in await host.node.fetch(host.keys.classpar)]
        except Exception as e:  # nothing readable: a fresh plan, as for a new swarm
            logger.info("no class-parallel plan recovered: %s", e)
            return
        plans = [p for p in found if isinstance(p, ClassParPlan) and p.job == host.job.name]
        if plans:
            self.classpar = max(plans, key=lambda p: p.epoch)
            logger.info(
                "recovered class-parallel plan epoch %d (%s)", self.classpar.epoch, self.classpar.status
            )

    async def _run_job(self) -> None:
        """Plan, follow the teacher and the builds, re-deal lost workers."""
        while True:
            await asyncio.sleep(self.host.cfg.poll_interval_s)
            try:
                await self._round()
            except Exception:  # one bad round must not end the service
                logger.exception("class-parallel round failed")

    async def _round(self) -> None:
        host = self.host
        assert host.node is not None
        teachers = [v.record for v in await host.node.fetch(host.keys.classpar_teacher)]
        found = [v.record for v in await host.node.fetch(host.keys.classpar_subnets)]
        subnets = [s for s in found if isinstance(s, ClassParSubnet)]
        if self.checker is None:
            streams = Streams(host.node.p2p)
            self.checker = SubnetChecker(streams, host.cfg.swarm_id, host.job, dht_addresses(host.node))
        plan = self.classpar
        live = {
            p: v for p, v in host.state.peers.items() if p not in host.state.leaving | self.checker.refused
        }
        if plan is not None and plan.status != "teacher":  # count only live holders' checked sub-networks
            subnets = await self.checker.accepted(plan, [s for s in subnets if s.peer_id in live])
        speeds = {p: device_of(v.record).tflops for p, v in live.items()}
        new, reason = next_plan(
            host.job,
            plan,
            speeds,
            [t for t in teachers if isinstance(t, ClassParTeacher)],
            subnets,
            get_dht_time(),
        )
        if new is None:
            if reason != host.last_reason:
                logger.info("class-parallel job %s: %s", host.job.name, reason)
            host.last_reason = reason
            return
        await self._publish_classpar(new)
        host.last_reason = reason
        logger.info("class-parallel plan epoch %d (%s): %s", new.epoch, new.status, reason)
        host.events.emit(ClassParPlanPublished(new, reason))

    async def _refresh_plan(self) -> None:
        while True:
            await asyncio.sleep(self.host.cfg.plan_ttl_s / 3)
            if self.classpar is not None:
                try:
                    await self._publish_classpar(
                        self.classpar.model_copy(update={"issued_at": get_dht_time()})
                    )
                except Exception:
                    logger.exception("class-parallel plan refresh failed")

    async def _publish_classpar(self, plan: ClassParPlan) -> None:
        host = self.host
        assert host.node is not None
        self.classpar = plan
        if not await host.node.publish(host.keys.classpar, plan, host.cfg.plan_ttl_s):
            logger.warning("class-parallel plan epoch %d stored by no DHT node yet", plan.epoch)
