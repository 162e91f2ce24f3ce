"""The coordinator of a class-parallel job (docs/class-parallel.md): the swarm's entry point, admission
desk and peer tracking of ``CoordinatorService``, with the pipeline's planning loop replaced by the
class-parallel one (``job/classpar.py`` decides; this publishes the ``ClassParPlan`` and keeps it fresh;
``classpar_check.py`` measures each sub-network a holder names before the plan counts it as held).

The job does not end by itself: once every coded worker is held the plan says "serving" and the
coordinator stays up as the swarm's entry point while ``potluck serve`` clients query the holders; it
re-deals the workers of a peer that leaves. Ctrl-C (SIGTERM) stops it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from hivemind.utils import get_dht_time

from potluck.classpar.folder import folder_digest
from potluck.classpar.swarm.check import SubnetChecker
from potluck.classpar.swarm.plan import next_plan
from potluck.coordinator.config import CoordinatorConfig
from potluck.coordinator.job.plan import device_of
from potluck.coordinator.service import CoordinatorService
from potluck.net.dial import dht_addresses
from potluck.net.streams import Streams
from potluck.protocol.classpar import ClassParPlan, ClassParSubnet, ClassParTeacher
from potluck.protocol.errors import JobSpecError
from potluck.protocol.identity import Identity
from potluck.protocol.invite import Invite
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import TrainPlan

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


class ClassParService(CoordinatorService):
    """A ``CoordinatorService`` for ``kind = "class_parallel"`` jobs on a swarm of their own."""

    def __init__(
        self,
        cfg: CoordinatorConfig,
        job: JobSpec,
        identity: Identity | None = None,
        join: Invite | None = None,
    ) -> None:
        if job.kind != "class_parallel":
            raise JobSpecError(f"job {job.name} is a {job.kind} job, not a class-parallel one")
        if join is not None:
            raise JobSpecError("a class-parallel job runs on a swarm of its own (launch without --join)")
        job = with_data_digest(job)
        super().__init__(cfg, job, identity)
        self.classpar: ClassParPlan | None = None
        self.on_classpar: Callable[[ClassParPlan, str], None] | None = None
        self.checker: SubnetChecker | None = None  # the sub-networks' accuracy check (classpar_check.py)

    async def _recover(self, saved: TrainPlan | None, joined: bool) -> None:
        """A restarted coordinator carries on with the plan the swarm holds (the same groups: they are
        seeded), from its epoch."""
        assert self.node is not None
        try:
            found = [v.record for v in await self.node.fetch(self.keys.classpar)]
        except Exception as e:  # nothing readable: a fresh plan, as for a new swarm
            logger.info("no class-parallel plan recovered: %s", e)
            return
        plans = [p for p in found if isinstance(p, ClassParPlan) and p.job == self.job.name]
        if plans:
            self.classpar = max(plans, key=lambda p: p.epoch)
            logger.info(
                "recovered class-parallel plan epoch %d (%s)", self.classpar.epoch, self.classpar.status
            )

    async def _run_job(self) -> None:
        """Replaces the pipeline's loop: plan, follow the teacher and the builds, re-deal lost workers."""
        while True:
            await asyncio.sleep(self.cfg.poll_interval_s)
            try:
                await self._round()
            except Exception:  # one bad round must not end the service
                logger.exception("class-parallel round failed")

    async def _round(self) -> None:
        assert self.node is not None
        teachers = [v.record for v in await self.node.fetch(self.keys.classpar_teacher)]
        found = [v.record for v in await self.node.fetch(self.keys.classpar_subnets)]
        subnets = [s for s in found if isinstance(s, ClassParSubnet)]
        if self.checker is None:
            streams = Streams(self.node.p2p)
            self.checker = SubnetChecker(streams, self.cfg.swarm_id, self.job, dht_addresses(self.node))
        plan = self.classpar
        live = {
            p: v for p, v in self.state.peers.items() if p not in self.state.leaving | self.checker.refused
        }
        if plan is not None and plan.status != "teacher":  # count only live holders' checked sub-networks
            subnets = await self.checker.accepted(plan, [s for s in subnets if s.peer_id in live])
        speeds = {p: device_of(v.record).tflops for p, v in live.items()}
        new, reason = next_plan(
            self.job,
            plan,
            speeds,
            [t for t in teachers if isinstance(t, ClassParTeacher)],
            subnets,
            get_dht_time(),
        )
        if new is None:
            if reason != self.last_reason:
                logger.info("class-parallel job %s: %s", self.job.name, reason)
            self.last_reason = reason
            return
        await self._publish_classpar(new)
        self.last_reason = reason
        logger.info("class-parallel plan epoch %d (%s): %s", new.epoch, new.status, reason)
        if self.on_classpar is not None:
            self.on_classpar(new, reason)

    async def _refresh_plan(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.plan_ttl_s / 3)
            if self.classpar is not None:
                try:
                    await self._publish_classpar(
                        self.classpar.model_copy(update={"issued_at": get_dht_time()})
                    )
                except Exception:
                    logger.exception("class-parallel plan refresh failed")

    async def _publish_classpar(self, plan: ClassParPlan) -> None:
        assert self.node is not None
        self.classpar = plan
        if not await self.node.publish(self.keys.classpar, plan, self.cfg.plan_ttl_s):
            logger.warning("class-parallel plan epoch %d stored by no DHT node yet", plan.epoch)
