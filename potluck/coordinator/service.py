"""The coordinator service: owns the swarm's DHT entry point, publishes the signed job, tracks peers.

I/O lives here; what it decides from the state (the plan) is computed by pure functions elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from hivemind.utils import get_dht_time

from potluck.coordinator.config import CoordinatorConfig
from potluck.coordinator.job.plan import calibrated_tflops, make_train_plan
from potluck.coordinator.job.progress import JobProgress, next_action
from potluck.coordinator.placement import PlacementPlan
from potluck.coordinator.state import SwarmState
from potluck.net.node import SwarmNode
from potluck.protocol.checkpoints import latest_complete, manifest_path, read_manifest
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.identity import Identity
from potluck.protocol.invite import Invite
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import JOB, LINKS, PEERS, PLAN, PROGRESS
from potluck.protocol.training import Progress, TrainPlan

logger = logging.getLogger(__name__)


class CoordinatorService:
    def __init__(self, cfg: CoordinatorConfig, job: JobSpec, identity: Identity | None = None) -> None:
        self.cfg, self.job = cfg, job
        self.identity = identity or Identity.load_or_create(cfg.identity_path)
        self.policy = TrustPolicy(cfg.swarm_id, self.identity.public_key)
        self.node: SwarmNode | None = None
        self.state = SwarmState(cfg.swarm_id, 0.0)
        self.on_change: Callable[[SwarmState, list[str], list[str]], None] | None = None
        self.on_plan: Callable[[TrainPlan, str], None] | None = None
        self.on_progress: Callable[[TrainPlan, JobProgress], None] | None = None
        self.plan: TrainPlan | None = None
        self.placement: PlacementPlan | None = None
        self.progress = JobProgress()
        self.finished = asyncio.Event()  # set when the job reached its last step everywhere
        self.last_reason = ""
        self.error: str | None = None  # set when the job was given up (finished is set too)
        self._enough_since: float | None = None  # when min_peers were first live (monotonic s)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> Invite:
        """Start the DHT node, store the signed job, and return the invite for peers."""
        self.node = await SwarmNode.start(
            self.identity, self.policy, self.cfg.net, self.cfg.initial_peers,
            key_dir=self.cfg.identity_path.parent,
        )  # fmt: skip
        if not await self.node.publish(JOB.name, self.job, self.cfg.job_ttl_s):
            logger.warning("job spec stored by no DHT node yet (a lone coordinator stores it locally)")
        bootstrap = tuple(await self.node.visible_maddrs()) + tuple(self.cfg.initial_peers)
        self._tasks = [
            asyncio.create_task(self._refresh_job(), name="refresh-job"),
            asyncio.create_task(self._track_peers(), name="track-peers"),
        ]
        if self.cfg.train:
            self._tasks += [
                asyncio.create_task(self._run_job(), name="run-job"),
                asyncio.create_task(self._refresh_plan(), name="refresh-plan"),
            ]
        return Invite(self.cfg.swarm_id, bootstrap, self.identity.public_key)

    async def read_state(self) -> SwarmState:
        assert self.node is not None
        peers, links = await asyncio.wait_for(
            asyncio.gather(self.node.fetch(PEERS.name), self.node.fetch(LINKS.name)),
            timeout=self.cfg.read_timeout_s,
        )
        return SwarmState.from_records(self.cfg.swarm_id, peers, links, get_dht_time())

    async def _refresh_job(self) -> None:
        assert self.node is not None
        while True:
            await asyncio.sleep(self.cfg.job_ttl_s / 3)
            try:
                await self.node.publish(JOB.name, self.job, self.cfg.job_ttl_s)
            except Exception as e:
                logger.warning("job refresh failed: %s", e)

    async def _track_peers(self) -> None:
        while True:
            try:
                state = await self.read_state()
            except Exception as e:  # a slow or failing read must not end the service
                logger.warning("reading swarm state failed: %s", e)
            else:
                joined, left = state.diff(self.state)
                self.state = state
                if (joined or left) and self.on_change is not None:
                    self.on_change(state, joined, left)
            await asyncio.sleep(self.cfg.poll_interval_s)

    async def _refresh_plan(self) -> None:
        assert self.node is not None
        while True:
            await asyncio.sleep(self.cfg.plan_ttl_s / 3)
            if self.plan is not None:
                try:
                    await self._publish_plan(self.plan.model_copy(update={"issued_at": get_dht_time()}))
                except Exception as e:
                    logger.warning("plan refresh failed: %s", e)

    async def _publish_plan(self, plan: TrainPlan) -> None:
        assert self.node is not None
        self.plan = plan
        if not await self.node.publish(PLAN.name, plan, self.cfg.plan_ttl_s):
            logger.warning("plan epoch %d stored by no DHT node yet", plan.epoch)

    def _resume_step(self) -> int:
        """The newest checkpoint every stage completed: on the coordinator's disk, else as reported."""
        root = self.cfg.checkpoint_root or Path(self.job.checkpoint.dir).expanduser()
        on_disk = latest_complete(root)
        step = 0
        if on_disk is not None:
            meta = read_manifest(manifest_path(on_disk.path, 0), on_disk.step, 0)["meta"]
            if meta.get("job") == self.job.name and meta.get("model") == self.job.model.model_dump():
                step = min(on_disk.step, self.job.steps)
            else:
                logger.warning("%s holds a checkpoint of another job or model; not resuming from it", root)
        return max(step, self.progress.complete_checkpoint())

    async def _run_job(self) -> None:
        """Plan when enough peers are live; re-plan on churn or failure; finish at the last step."""
        assert self.node is not None
        while not self.finished.is_set():
            await asyncio.sleep(self.cfg.poll_interval_s)
            try:
                records = [v.record for v in await self.node.fetch(PROGRESS.name)]
                self.progress.update(self.plan, [r for r in records if isinstance(r, Progress)])
                if self.plan is not None:
                    self.progress.advanced(self.plan)
                if self.plan is not None and self.on_progress is not None:
                    self.on_progress(self.plan, self.progress)
                action, reason = next_action(self.state, self.job, self.plan, self.progress)
                if action in ("plan", "replan"):
                    await self._replan(reason, failed=action == "replan")
                elif action == "fail":
                    self.error = f"job {self.job.name} failed: {reason}; last error: {self.last_reason}"
                    logger.error("%s", self.error)
                    self.finished.set()
                elif action == "done" and self.plan is not None:
                    await self._publish_plan(self.plan.model_copy(
                        update={"epoch": self.plan.epoch + 1, "status": "done", "issued_at": get_dht_time()}
                    ))  # fmt: skip
                    self.last_reason = reason
                    logger.info("job %s done: %s", self.job.name, reason)
                    self.finished.set()
            except Exception as e:  # one bad round must not end the service
                logger.warning("job round failed: %s", e)

    def _links_pending(self) -> bool:
        """Before the first plan: give the peers' first link reports up to ``link_wait_s`` to arrive."""
        if self.plan is not None or len(self.state.peers) < self.job.min_peers:
            self._enough_since = None
            return False
        now = time.monotonic()
        self._enough_since = self._enough_since or now
        reported = sum(1 for p in self.state.peers if p in self.state.links)
        return reported < len(self.state.peers) and now - self._enough_since < self.cfg.link_wait_s

    async def _replan(self, why: str, failed: bool = False) -> None:
        if self._links_pending():
            self.last_reason = "enough peers; waiting briefly for their link measurements"
            return
        epoch = 1 if self.plan is None else self.plan.epoch + 1
        start = self._resume_step()
        speeds = calibrated_tflops(self.plan, self.job, self.progress.compute_s) if self.plan else {}
        plan, placement, reason = await asyncio.to_thread(
            make_train_plan, self.state, self.job, get_dht_time(), epoch, start, self.placement, None, speeds
        )
        if plan is None:
            if reason != self.last_reason:
                logger.info("not planning yet: %s", reason)
            self.last_reason = reason
            return
        self.placement = placement
        self.progress.new_epoch(failed)
        await self._publish_plan(plan)
        self.last_reason = f"{why} -> {reason}"
        logger.info("published plan epoch %d from step %d: %s", epoch, start, self.last_reason)
        if self.on_plan is not None:
            self.on_plan(plan, self.last_reason)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.node is not None:
            await self.node.shutdown()
            self.node = None
