"""The pipeline job kind inside the coordinator (the LLM path): plan stages and replicas when enough
peers are live, re-plan on churn, failure, a ban or a better placement, pause and resume under leases,
finish at the last step.

I/O lives here; every decision is a pure function of ``job/``: ``next_action`` says what to do,
``make_train_plan`` plans, ``choose_resume`` picks the start step, ``JoinDesk`` prices newcomers,
``hostile_peers`` convicts, ``job/lease.py`` pauses. ``replan.py`` holds the plan in force and turns
a decision into a published plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

from hivemind.utils import get_dht_time

from potluck.coordinator.events import ProgressRead
from potluck.coordinator.job.accuse import AccuseConfig, hostile_peers
from potluck.coordinator.job.handoff import typical_step_s
from potluck.coordinator.job.lease import pause_reason, pause_step, paused_action
from potluck.coordinator.job.plan import usable_peers
from potluck.coordinator.job.progress import JobProgress, next_action
from potluck.coordinator.kinds import JobHost
from potluck.coordinator.probes import ConnectionWatch, probe_suspects, sweep_failed_plan
from potluck.coordinator.replan import Replanner
from potluck.protocol.training import TrainPlan, gradients_rechecked
from potluck.telemetry.summary import JobRate

logger = logging.getLogger(__name__)


class PipelineJob:
    """The "pipeline" kind's driver (``kinds.JobDriver``)."""

    def __init__(self, host: JobHost) -> None:
        self.host = host
        self.planner = Replanner(host)  # the plan in force and how the next one is made
        self.accuse = AccuseConfig()
        self.rate = JobRate(host.job.batch.tokens_per_step, host.job.steps)  # telemetry/summary.py
        self.last_action = ""  # the newest next_action verdict, so a hold is logged once
        self._probed: dict[str, float] = {}  # suspect -> the suspicion (DHT time) it was probed for
        self._swept: set[int] = set()  # plan epochs whose placed peers were all probed after a failure
        self._watch = ConnectionWatch()
        self._wake = asyncio.Event()  # set when a round should run now, not at the next poll

    @property
    def plan(self) -> TrainPlan | None:
        return self.planner.plan

    @property
    def progress(self) -> JobProgress:
        return self.planner.progress

    def loops(self) -> dict[str, Coroutine[Any, Any, None]]:
        tasks = {"run-job": self._run_job(), "refresh-plan": self._refresh_plan()}
        if self.host.cfg.connection_watch_s > 0:
            tasks["watch-connections"] = self._watch_connections()
        if self.host.owner is not None and self.host.owner.copier is not None:
            tasks["copy-checkpoints"] = self._copy_checkpoints()
        return tasks

    async def recover(self, saved: TrainPlan | None, joined: bool) -> None:
        await self.planner.recover(saved, joined)

    async def _refresh_plan(self) -> None:
        while True:
            await asyncio.sleep(self.host.cfg.plan_ttl_s / 3)
            if self.plan is not None:
                try:
                    await self.planner.publish(self.plan.model_copy(update={"issued_at": get_dht_time()}))
                except Exception:
                    logger.exception("plan refresh failed")

    async def _copy_checkpoints(self) -> None:
        """Start a copy whenever every stage of the current plan reported a newer checkpoint."""
        owner = self.host.owner
        assert owner is not None
        while True:
            await asyncio.sleep(self.host.cfg.poll_interval_s)
            owner.tick(self.plan, self.progress.complete_checkpoint())

    def _observe(self, plan: TrainPlan) -> None:
        """The swarm's step into the job's rate: from the first step past this plan's start (a later
        epoch's start step is one the swarm holds; a hand-off plan may start at the last step)."""
        step = self.progress.step(plan)
        if step > plan.start_step or 0 < plan.start_step == step:
            self.rate.observe(step, time.monotonic())

    async def _run_job(self) -> None:
        """Plan when enough peers are live; re-plan on churn or failure; finish at the last step."""
        host = self.host
        assert host.node is not None
        while not host.finished.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), host.cfg.poll_interval_s)
            self._wake.clear()
            try:
                await self._round()
            except Exception:  # one bad round must not end the service
                logger.exception("job round failed")

    async def _watch_connections(self) -> None:
        """A placed peer whose connection to this coordinator's daemon went away and that refuses a dial
        is gone: the job's next round runs at once and re-plans without it."""
        host = self.host
        assert host.node is not None
        while not host.finished.is_set():
            await asyncio.sleep(host.cfg.connection_watch_s)
            try:
                gone = await self._watch.poll(
                    host.node.p2p, host.state, self.progress, self.plan, host.cfg.suspect_probe_s
                )
            except Exception:  # a failed poll must not end the watch
                logger.exception("connection watch failed")
                continue
            if gone:
                self._wake.set()

    async def _round(self) -> None:
        host = self.host
        assert host.node is not None
        await self.planner.read_progress()
        if self.plan is not None:
            self.progress.advanced(self.plan)
            if await self._convict():
                return
            self._observe(self.plan)
            host.events.emit(ProgressRead(self.plan, self.progress))
        if self.plan is not None:
            await sweep_failed_plan(
                host.node.p2p, host.state, self.progress, self.plan, self._swept, host.cfg.suspect_probe_s
            )
        await probe_suspects(
            host.node.p2p,
            host.state,
            self.progress,
            self.planner.retry,
            self._probed,
            host.cfg.suspect_probe_s,
        )
        action, reason = next_action(
            host.state,
            host.job,
            self.plan,
            self.progress,
            get_dht_time(),
            usable=usable_peers(host.state, host.job)[0],
            retry=self.planner.retry,
        )
        action, reason = await self._lease_action(action, reason)
        if action == "hold" and self.last_action != "hold":
            logger.info("%s", reason)  # once per broken plan; the next action says what follows
        self.last_action = action
        if action in ("plan", "replan", "leave"):
            await self.planner.replan(reason, failed=action == "replan", handoff=action == "leave")
        elif action == "wait":
            await self.planner.tend_joiners()
        elif action == "paused":
            host.last_reason = reason
        elif action == "fail":
            host.error = f"job {host.job.name} failed: {reason}; last error: {host.last_reason}"
            logger.error("%s", host.error)
            host.finished.set()
        elif action == "done" and self.plan is not None:
            await self._finish(self.plan, reason)

    async def _finish(self, plan: TrainPlan, reason: str) -> None:
        host = self.host
        done = plan.model_copy(
            update={"epoch": plan.epoch + 1, "status": "done", "issued_at": get_dht_time()}
        )
        await self.planner.publish(done)
        host.last_reason = reason
        logger.info("job %s done: %s", host.job.name, reason)
        if host.owner is not None:  # its last checkpoint, before saying it is done
            step = self.progress.complete_checkpoint()
            await host.owner.final(done, step, host.cfg.final_copy_timeout_s)
        host.finished.set()

    async def _lease_action(self, action: str, reason: str) -> tuple[str, str]:
        """Several jobs on one swarm (``job/lease.py``): pause when the lease leaves too few peers to plan
        with, and resume ("plan") from the pause's checkpoint once it gives enough back."""
        host, plan = self.host, self.plan
        if plan is not None and plan.stop_at is not None and plan.status == "training":
            reached = {p: r.step for p, r in self.progress.latest.items()}
            act, told = paused_action(host.state, plan, host.job.min_peers, reached)
            return ("plan" if act == "plan" else "paused"), told
        leased, moving = host.allocation is not None, action in ("leave", "replan")
        why = pause_reason(host.state, plan, host.job.min_peers, leased) if moving else None
        if plan is None or why is None:
            return action, reason
        lead_s = host.cfg.handoff_lead_s + 2 * host.cfg.poll_interval_s
        step_s, h = typical_step_s(self.progress.latest.values()), plan.under(host.job).compression.sync_every
        at = pause_step(self.progress.step(plan), step_s, lead_s, host.job.steps, h)
        if at is None:
            return action, reason  # too close to the end: finish instead (the leavers wait for it)
        await self.planner.publish(plan.model_copy(update={"stop_at": at, "issued_at": get_dht_time()}))
        host.last_reason = f"{why}: pausing after step {at}"
        logger.info("plan epoch %d pauses: %s", plan.epoch, host.last_reason)
        self.planner.published(self.plan or plan, host.last_reason)
        return "paused", host.last_reason

    async def _convict(self) -> bool:
        """Ban the placed peers their stage's replicas testify against (``job/accuse.py``) and re-plan
        without them; True when it did."""
        host, plan = self.host, self.plan
        assert plan is not None
        rechecked = [j for j in range(len(plan.stages)) if gradients_rechecked(host.job, plan, j)]
        found = [
            (p, why)
            for p, why in hostile_peers(plan, self.progress.latest.values(), self.accuse, rechecked)
            if p not in host.policy.banned
        ]
        for peer, why in found:
            host.ban(peer, why)
        if found:
            host.state = host.state.without([p for p, _ in found])
            await self.planner.replan(f"banned {', '.join(p[:12] for p, _ in found)}", handoff=True)
        return bool(found)
