"""The coordinator service: owns the swarm's DHT entry point, publishes the signed job, tracks peers.

I/O lives here; what it decides from the state (the plan) is computed by pure functions elsewhere.
Its loops run as named tasks under ``aio.supervise``: a crash of one is logged with its name, stops
the others and ends the job with ``error`` set, instead of leaving a service that silently stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Coroutine
from pathlib import Path
from typing import Any

from hivemind.utils import get_dht_time

from potluck import logs
from potluck.aio import bounded, supervise
from potluck.coordinator.config import CoordinatorConfig
from potluck.coordinator.job.plan import calibrated_tflops, make_train_plan, usable_peers
from potluck.coordinator.job.progress import JobProgress, RetryPolicy, next_action
from potluck.coordinator.job.resume import live_step, resume_point
from potluck.coordinator.placement import PlacementPlan
from potluck.coordinator.state import SwarmState
from potluck.errors import TaskFailed
from potluck.net.dial import reachable
from potluck.net.node import SwarmNode
from potluck.protocol.checkpoints import latest_complete, manifest_path, read_manifest
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.identity import Identity
from potluck.protocol.invite import Invite
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import JOB, LINKS, PEERS, PLAN, PROGRESS
from potluck.protocol.training import Progress, Spare, TrainPlan

logger = logging.getLogger(__name__)


# Plans in a row that may start from live state before falling back to checkpoints: a live hand-off
# can fail once for timing (a holder still unwinding its run); twice means the state is not to be had.
LIVE_RESUME_TRIES = 2


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
        self.retry = RetryPolicy(max_backoff_s=cfg.max_backoff_s, slack_s=cfg.suspect_slack_s)
        self.finished = asyncio.Event()  # set when the job reached its last step everywhere
        self.last_reason = ""
        self.last_action = ""  # the newest next_action verdict, so a hold is logged once
        self._probed: dict[str, float] = {}  # suspect -> the suspicion (DHT time) it was probed for
        self.error: str | None = None  # set when the job was given up (finished is set too)
        self._enough_since: float | None = None  # when min_peers were first live (monotonic s)
        self._running: asyncio.Task[None] | None = None  # the supervisor of the service's loops

    async def start(self) -> Invite:
        """Start the DHT node, store the signed job, and return the invite for peers."""
        logs.bind(peer_id=self.identity.peer_id, swarm_id=self.cfg.swarm_id)
        self.node = await SwarmNode.start(
            self.identity,
            self.policy,
            self.cfg.net,
            self.cfg.initial_peers,
            key_dir=self.cfg.identity_path.parent,
        )
        if not await self.node.publish(JOB.name, self.job, self.cfg.job_ttl_s):
            logger.warning("job spec stored by no DHT node yet (a lone coordinator stores it locally)")
        bootstrap = tuple(await self.node.visible_maddrs()) + tuple(self.cfg.initial_peers)
        tasks: dict[str, Coroutine[Any, Any, None]] = {
            "refresh-job": self._refresh_job(),
            "track-peers": self._track_peers(),
        }
        if self.cfg.train:
            tasks |= {"run-job": self._run_job(), "refresh-plan": self._refresh_plan()}
        self._running = asyncio.create_task(self._supervise(tasks), name="coordinator")
        return Invite(self.cfg.swarm_id, bootstrap, self.identity.public_key)

    async def _supervise(self, tasks: dict[str, Coroutine[Any, Any, None]]) -> None:
        try:
            await supervise(tasks)
        except TaskFailed as e:  # logged with its traceback where it happened
            self.error = f"job {self.job.name} stopped: {e}"
            self.finished.set()

    async def read_state(self) -> SwarmState:
        assert self.node is not None
        peers, links = await bounded(
            asyncio.gather(self.node.fetch(PEERS.name), self.node.fetch(LINKS.name)),
            self.cfg.read_timeout_s,
            "reading the swarm state",
        )
        return SwarmState.from_records(self.cfg.swarm_id, peers, links, get_dht_time())

    async def _refresh_job(self) -> None:
        assert self.node is not None
        while True:
            await asyncio.sleep(self.cfg.job_ttl_s / 3)
            try:
                await self.node.publish(JOB.name, self.job, self.cfg.job_ttl_s)
            except Exception:
                logger.exception("job refresh failed")

    async def _track_peers(self) -> None:
        while True:
            try:
                state = await self.read_state()
            except TimeoutError as e:  # a slow read must not end the service
                logger.warning("%s", e)
            except Exception:  # nor a failing one
                logger.exception("reading swarm state failed")
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
                except Exception:
                    logger.exception("plan refresh failed")

    async def _publish_plan(self, plan: TrainPlan) -> None:
        assert self.node is not None
        self.plan = plan
        if not await self.node.publish(PLAN.name, plan, self.cfg.plan_ttl_s):
            logger.warning("plan epoch %d stored by no DHT node yet", plan.epoch)

    def _resume_step(self, live_peers: Collection[str]) -> int:
        """The step live replicas hold (when every stage kept one and live state has not just failed),
        else the newest checkpoint every stage completed: on the coordinator's disk, else as reported.
        Reads the disk here; ``job.resume.resume_point`` decides."""
        root = self.cfg.checkpoint_root or Path(self.job.checkpoint.dir).expanduser()
        on_disk = latest_complete(root)
        meta = read_manifest(manifest_path(on_disk.path, 0), on_disk.step, 0).meta if on_disk else None
        live = None
        if self.plan is not None and self.progress.failures < LIVE_RESUME_TRIES:
            live = live_step(self.plan, self.progress.latest, live_peers)
        point = resume_point(self.job, meta, self.progress.complete_checkpoint(), live)
        if point.ignored is not None:
            logger.warning("%s %s; not resuming from it", root, point.ignored)
        logger.info("resume at step %d: %s", point.step, point.reason)
        return point.step

    async def _probe_suspects(self) -> None:
        """Dial each pending suspect once per suspicion: a crashed peer refuses at once, so the re-plan
        need not wait out its heartbeat interval. A peer that answers stays pending (its heartbeat
        decides); the probes run concurrently, each bounded by ``suspect_probe_s``."""
        assert self.node is not None
        pending, _ = self.progress.verdicts(self.state, get_dht_time(), self.retry)
        todo = [p for p in pending if self._probed.get(p) != self.progress.suspects[p]]
        if not todo:
            return
        probes = [
            reachable(self.node.p2p, p, self.state.peers[p].record.maddrs, self.cfg.suspect_probe_s)
            for p in todo
        ]
        answers = await asyncio.gather(*probes)
        now = get_dht_time()
        for peer, ok in zip(todo, answers, strict=True):
            self._probed[peer] = self.progress.suspects[peer]
            if not ok:
                logger.info("suspect %s does not answer a direct probe: confirmed", peer[:12])
                self.progress.probe_failed(peer, now)

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
                await self._probe_suspects()
                action, reason = next_action(
                    self.state,
                    self.job,
                    self.plan,
                    self.progress,
                    get_dht_time(),
                    usable=usable_peers(self.state, self.job)[0],
                    retry=self.retry,
                )
                if action == "hold" and self.last_action != "hold":
                    logger.info("%s", reason)  # once per broken plan; the next action says what follows
                self.last_action = action
                if action in ("plan", "replan"):
                    await self._replan(reason, failed=action == "replan")
                elif action == "fail":
                    self.error = f"job {self.job.name} failed: {reason}; last error: {self.last_reason}"
                    logger.error("%s", self.error)
                    self.finished.set()
                elif action == "done" and self.plan is not None:
                    await self._publish_plan(
                        self.plan.model_copy(
                            update={
                                "epoch": self.plan.epoch + 1,
                                "status": "done",
                                "issued_at": get_dht_time(),
                            }
                        )
                    )
                    self.last_reason = reason
                    logger.info("job %s done: %s", self.job.name, reason)
                    self.finished.set()
            except Exception:  # one bad round must not end the service
                logger.exception("job round failed")

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
        speeds = calibrated_tflops(self.plan, self.job, self.progress.compute_s) if self.plan else {}
        now = get_dht_time()
        # Suspects that did not heartbeat since a peer failed to reach them sit this plan out.
        _, excluded = self.progress.verdicts(self.state, now, self.retry)
        excluded = [p for p in excluded if p in self.state.peers]
        state = self.state.without(excluded)
        start = self._resume_step(set(state.peers))
        plan, placement, reason = await asyncio.to_thread(
            make_train_plan, state, self.job, now, epoch, start, self.placement, None, speeds
        )
        if plan is None:
            if reason != self.last_reason:
                logger.info("not planning yet: %s", reason)
            self.last_reason = reason
            return
        if excluded:
            why = "suspected: unreachable, and no heartbeat since"
            spares = plan.spares + [Spare(peer_id=p, reason=why) for p in excluded]
            plan = plan.model_copy(update={"spares": spares})
            reason = f"{reason}; left out {len(excluded)} suspect(s)"
        self.placement = placement
        self.progress.new_epoch(failed)
        await self._publish_plan(plan)
        self.last_reason = f"{why} -> {reason}"
        logger.info("published plan epoch %d from step %d: %s", epoch, start, self.last_reason)
        if self.on_plan is not None:
            self.on_plan(plan, self.last_reason)

    async def stop(self) -> None:
        """Stop the loops (each within ``aio.DEFAULT_GRACE_S``), then the DHT node."""
        if self._running is not None:
            self._running.cancel()
            await asyncio.wait({self._running})
            self._running = None
        if self.node is not None:
            await self.node.shutdown()
            self.node = None
