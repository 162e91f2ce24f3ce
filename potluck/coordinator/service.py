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
from typing import Any, Literal

from hivemind.utils import get_dht_time

from potluck import logs
from potluck.aio import bounded, supervise
from potluck.coordinator import admission, rejoin
from potluck.coordinator.admission import AdmissionDesk
from potluck.coordinator.allocator import Allocator
from potluck.coordinator.config import CoordinatorConfig
from potluck.coordinator.copies import OwnerCopy
from potluck.coordinator.job.accuse import AccuseConfig, hostile_peers
from potluck.coordinator.job.codecs import MeasuredRatios
from potluck.coordinator.job.handoff import handoff_step, typical_step_s
from potluck.coordinator.job.improve import ImproveConfig
from potluck.coordinator.job.joins import JoinDesk
from potluck.coordinator.job.lease import leased_state, pause_reason, pause_step, paused_action
from potluck.coordinator.job.plan import device_of, make_train_plan, usable_peers
from potluck.coordinator.job.progress import JobProgress, RetryPolicy, next_action
from potluck.coordinator.job.resume import choose_resume
from potluck.coordinator.job.speeds import MeasuredSpeeds
from potluck.coordinator.placement import PlacementPlan
from potluck.coordinator.probes import probe_suspects
from potluck.coordinator.state import SwarmState
from potluck.errors import TaskFailed
from potluck.net.admit import admitted
from potluck.net.node import SwarmNode
from potluck.net.streams import Streams
from potluck.protocol.admission import JoinToken
from potluck.protocol.allocation import Allocation
from potluck.protocol.checkpoints import latest_complete, manifest_path, read_manifest
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.identity import Identity
from potluck.protocol.invite import Invite
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import LINKS, PEERS, JobKeys
from potluck.protocol.training import Progress, Spare, TrainPlan, gradients_rechecked

logger = logging.getLogger(__name__)


RESUME_SETTLE_S = 10.0  # longest a re-plan waits for live peers to report state newer than it found


class CoordinatorService:
    first_epoch = 1  # the epoch of the first plan (higher after a restart: start() recovers it)
    _memory: rejoin.Memory | None = None  # what a restart needs, on disk (set by start())

    def __init__(
        self,
        cfg: CoordinatorConfig,
        job: JobSpec,
        identity: Identity | None = None,
        join: Invite | None = None,
    ) -> None:
        """``join``: add ``job`` to the running swarm of this invite (``potluck launch --join``): this
        process is the job's coordinator, signing its records as the job's owner; the swarm's own
        coordinator admits the job and allocates peers to it (``allocator.py``)."""
        self.cfg, self.job, self.join = cfg, job, join
        self.identity = identity or Identity.load_or_create(cfg.identity_path)
        self.keys = JobKeys(job.name, home=join is None)
        swarm_key = join.coordinator_key if join is not None else self.identity.public_key
        self.policy = TrustPolicy(cfg.swarm_id, swarm_key, require_admission=True)
        self.desk = AdmissionDesk(self.identity, cfg.swarm_id, cfg.admit, self.policy.banned)
        self.desk.home_job = job.name
        self.node: SwarmNode | None = None
        self.swarm = SwarmState(cfg.swarm_id, 0.0)  # every live peer
        self.state = SwarmState(cfg.swarm_id, 0.0)  # the peers this job may use (``job/lease.py``)
        self.allocation: Allocation | None = None  # the leases in force (None: a one-job swarm)
        self.allocator: Allocator | None = None  # the swarm's coordinator allocates; a joined one not
        self.on_change: Callable[[SwarmState, list[str], list[str]], None] | None = None
        self.on_plan: Callable[[TrainPlan, str], None] | None = None
        self.on_progress: Callable[[TrainPlan, JobProgress], None] | None = None
        self.plan: TrainPlan | None = None
        self.placement: PlacementPlan | None = None
        self.progress = JobProgress()
        self.retry = RetryPolicy(max_backoff_s=cfg.max_backoff_s, slack_s=cfg.suspect_slack_s)
        improve = ImproveConfig(restart_s=cfg.join_restart_s, margin=cfg.join_margin)
        self.joins = JoinDesk(cfg.join_check_s, cfg.join_recheck_s, improve)  # peers that came later
        self.finished = asyncio.Event()  # set when the job reached its last step everywhere
        self.last_reason = ""
        self.accuse = AccuseConfig()
        self.speeds = MeasuredSpeeds()  # TFLOP/s measured on this job, and the peers that overclaim
        self.ratios = MeasuredRatios()  # activation codec ratios measured on this job (job/codecs.py)
        self.last_action = ""  # the newest next_action verdict, so a hold is logged once
        self._probed: dict[str, float] = {}  # suspect -> the suspicion (DHT time) it was probed for
        self.error: str | None = None  # set when the job was given up (finished is set too)
        self._enough_since: float | None = None  # when min_peers were first live (monotonic s)
        self._running: asyncio.Task[None] | None = None  # the supervisor of the service's loops
        self.owner: OwnerCopy | None = None  # the job owner's checkpoint copy: served, kept current
        self.resume_from: Literal["live", "checkpoint"] = "live"  # of the newest resume point
        self._settle_since: float | None = None  # when a re-plan began waiting for live peers' reports
        self._resume_reason = ""

    async def start(self) -> Invite:
        """Start the DHT node, store the signed job, and return the invite for peers."""
        logs.bind(peer_id=self.identity.peer_id, swarm_id=self.cfg.swarm_id)
        self._memory = rejoin.Memory(self.cfg, self.job.name, self.identity.peer_id)
        saved = self._memory.loaded
        self.node, joined = await rejoin.join(self.identity, self.policy, self.cfg, saved)
        if self.cfg.train:  # before anything is published: carry on with the plan the swarm follows
            self.allocator = Allocator(
                self.node, self.job, self.cfg.alloc, self.desk, self.cfg.read_timeout_s
            )
            if joined:
                await self.allocator.restore()
                self.allocation = self.allocator.in_force(get_dht_time())
            await self._recover(saved.plan if saved is not None else None, joined)
        if not await self.node.publish(self.keys.job, self.job, self.cfg.job_ttl_s):
            logger.warning("job spec stored by no DHT node yet (a lone coordinator stores it locally)")
        bootstrap = tuple(await self.node.visible_maddrs()) + tuple(self.cfg.initial_peers)
        streams = Streams(self.node.p2p)
        await self._start_owner_copy(streams)
        await admission.restore_token_uses(self.node, self.desk, self.cfg.read_timeout_s)
        await self.desk.serve(streams, get_dht_time)
        tasks: dict[str, Coroutine[Any, Any, None]] = {
            "refresh-job": self._refresh_job(),
            "track-peers": self._track_peers(),
            "bans": admission.keep_access(self.node, self.desk, self.policy, self.cfg, self.ban),
        }
        if self.cfg.remember:
            tasks["remember"] = self._remember()
        if self.cfg.train:
            tasks["allocate"] = self._allocate()
        self._run(tasks)
        return Invite(
            self.cfg.swarm_id, bootstrap, self.identity.public_key, self.mint_token(), self.cfg.mqtt_url
        )

    async def end_offer(self) -> None:
        """At the job's end: nothing to withdraw here (a joined job's offer: ``joined_service.py``)."""

    async def _allocate(self) -> None:
        """The swarm's coordinator allocates its peers to the jobs on it, each poll (``allocator.py``)."""
        assert self.allocator is not None
        while True:
            try:
                step = self.progress.step(self.plan) if self.plan is not None else 0
                now = get_dht_time()
                placed = self.plan.peers if self.plan is not None else frozenset()
                await self.allocator.tick(self.swarm, step, self.finished.is_set(), now, placed)
                self.allocation = self.allocator.in_force(now)
            except Exception:  # the leases in force run on; the next poll tries again
                logger.exception("allocation round failed")
            await asyncio.sleep(self.cfg.poll_interval_s)

    async def _start_owner_copy(self, streams: Streams) -> None:
        """The job owner's copy of each complete checkpoint, pulled from the peers (``copies.py``)."""
        copy_mb_s = self.cfg.copy_rate_mb_s if self.cfg.copy_checkpoints and self.cfg.train else None
        root = self.checkpoint_root
        self.owner = OwnerCopy(
            streams, self.cfg.swarm_id, self.identity, self.job, root, copy_mb_s, self._may_fetch
        )
        await self.owner.start()

    def _run(self, tasks: dict[str, Coroutine[Any, Any, None]]) -> None:
        """Supervise ``tasks`` plus the training loops and the checkpoint copy, as configured."""
        if self.cfg.train:
            tasks |= {"run-job": self._run_job(), "refresh-plan": self._refresh_plan()}
        if self.owner is not None and self.owner.copier is not None:
            tasks["copy-checkpoints"] = self._copy_checkpoints()
        self._running = asyncio.create_task(self._supervise(tasks), name="coordinator")

    def _may_fetch(self, peer: str, admission: bytes | None) -> bool:
        return admitted(self.policy, peer, admission, get_dht_time())

    def mint_token(self) -> str | None:
        """The printed invite's join token (None in an open swarm, where any peer is admitted)."""
        if self.cfg.admit.open:
            return None
        expires = get_dht_time() + self.cfg.token_ttl_s
        return JoinToken.mint(self.identity, self.cfg.swarm_id, expires, self.cfg.token_uses)

    def ban(self, peer: str, why: str) -> None:
        """Refuse ``peer`` from now on: its records here at once, everywhere at the next ban-list read."""
        if peer not in self.policy.banned:
            self.policy.banned.add(peer)
            logger.warning("banned %s: %s", peer, why)

    async def _recover(self, saved: TrainPlan | None, joined: bool) -> None:
        """Carry on with the plan the swarm follows and its progress (``job.recover`` decides), and wait
        (``recover_peers_s`` at most) for its placed peers' heartbeats, so that the first round does not
        take peers that are training for gone."""
        assert self.node is not None
        rec = await rejoin.read_recovery(self.node, self.cfg, self.job.name, saved, joined, self.keys)
        self.first_epoch = rec.next_epoch
        if rec.next_epoch > 1:
            logger.info("recovered: %s; the next plan is epoch %d", rec.reason, rec.next_epoch)
        if rec.plan is None:
            return
        self.plan, self.progress, self.last_reason = rec.plan, rec.progress, f"recovered {rec.reason}"
        placed = {p for st in rec.plan.stages for p in st.peers}
        self.state = await rejoin.await_peers(self.read_state, placed, self.cfg.recover_peers_s, self.state)
        if self.on_change is not None and self.state.peers:
            self.on_change(self.state, sorted(self.state.peers), [])
        if rec.from_saved:  # the plan record expired while we were away: peers that restart need it
            await self._publish_plan(rec.plan.model_copy(update={"issued_at": get_dht_time()}))

    def save_memory(self) -> None:
        """Save what a restart needs now (``rejoin.Memory``); the launch calls it when the job ends."""
        if self._memory is not None:
            self._memory.save(self.state, self.plan, self.finished.is_set())

    async def _remember(self) -> None:
        while True:
            self.save_memory()
            await asyncio.sleep(self.cfg.poll_interval_s)

    @property
    def checkpoint_root(self) -> Path:
        """The job owner's checkpoint directory, on this machine."""
        return self.cfg.checkpoint_root or Path(self.job.checkpoint.dir).expanduser()

    async def _copy_checkpoints(self) -> None:
        """Start a copy whenever every stage of the current plan reported a newer checkpoint."""
        assert self.owner is not None
        while True:
            await asyncio.sleep(self.cfg.poll_interval_s)
            self.owner.tick(self.plan, self.progress.complete_checkpoint())

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
                await self.node.publish(self.keys.job, self.job, self.cfg.job_ttl_s)
            except Exception:
                logger.exception("job refresh failed")

    async def _track_peers(self) -> None:
        while True:
            try:
                self.swarm = await self.read_state()
                if self.join is not None and self.node is not None:
                    self.allocation = await self.node.read_allocation()
                state = leased_state(self.swarm, self.allocation, self.job.name, self.plan, self.keys.home)
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
        if not await self.node.publish(self.keys.plan, plan, self.cfg.plan_ttl_s):
            logger.warning("plan epoch %d stored by no DHT node yet", plan.epoch)

    def _resume_step(self, live_peers: Collection[str]) -> int:
        """The step live peers hold in memory (when together they hold every layer and live state has
        not just failed), else the newest checkpoint: the job owner's copy on this machine, or the newest
        step whose every layer live peers reported keeping (until that, too, failed once).
        Reads the disk here; ``job.resume.choose_resume`` decides."""
        root = self.checkpoint_root
        on_disk = latest_complete(root)
        meta = read_manifest(manifest_path(on_disk.path, 0), on_disk.step, 0).meta if on_disk else None
        # Peers' own disks, as their reports suggest (any live peer's: one leased to another job still
        # serves them); once that failed too, the owner's copy if there is one.
        disks = set(live_peers) | set(self.swarm.peers)
        point = choose_resume(self.job, self.plan, self.progress, live_peers, disks, meta)
        if point.ignored is not None:
            logger.warning("%s %s; not resuming from it", root, point.ignored)
        if point.reason != self._resume_reason:  # asked every round until a plan is made: say it once
            logger.info("resume at step %d: %s", point.step, point.reason)
            self._resume_reason = point.reason
        self.resume_from = "checkpoint" if point.from_checkpoint else "live"
        return point.step

    async def _run_job(self) -> None:
        """Plan when enough peers are live; re-plan on churn or failure; finish at the last step."""
        assert self.node is not None
        while not self.finished.is_set():
            await asyncio.sleep(self.cfg.poll_interval_s)
            try:
                await self._read_progress()
                if self.plan is not None:
                    self.progress.advanced(self.plan)
                    if await self._convict():
                        continue
                if self.plan is not None and self.on_progress is not None:
                    self.on_progress(self.plan, self.progress)
                probe_s = self.cfg.suspect_probe_s
                await probe_suspects(
                    self.node.p2p, self.state, self.progress, self.retry, self._probed, probe_s
                )
                action, reason = next_action(
                    self.state,
                    self.job,
                    self.plan,
                    self.progress,
                    get_dht_time(),
                    usable=usable_peers(self.state, self.job)[0],
                    retry=self.retry,
                )
                action, reason = await self._lease_action(action, reason)
                if action == "hold" and self.last_action != "hold":
                    logger.info("%s", reason)  # once per broken plan; the next action says what follows
                self.last_action = action
                if action in ("plan", "replan", "leave"):
                    await self._replan(reason, failed=action == "replan", handoff=action == "leave")
                elif action == "wait":
                    await self._tend_joiners()
                elif action == "paused":
                    self.last_reason = reason
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
                    if self.owner is not None:  # its last checkpoint, before saying it is done
                        step = self.progress.complete_checkpoint()
                        await self.owner.final(self.plan, step, self.cfg.final_copy_timeout_s)
                    self.finished.set()
            except Exception:  # one bad round must not end the service
                logger.exception("job round failed")

    async def _lease_action(self, action: str, reason: str) -> tuple[str, str]:
        """Several jobs on one swarm (``job/lease.py``): pause when the lease leaves too few peers to plan
        with, and resume ("plan") from the pause's checkpoint once it gives enough back."""
        plan = self.plan
        if plan is not None and plan.stop_at is not None and plan.status == "training":
            reached = {p: r.step for p, r in self.progress.latest.items()}
            act, told = paused_action(self.state, plan, self.job.min_peers, reached)
            return ("plan" if act == "plan" else "paused"), told
        leased, moving = self.allocation is not None, action in ("leave", "replan")
        why = pause_reason(self.state, plan, self.job.min_peers, leased) if moving else None
        if plan is None or why is None:
            return action, reason
        lead_s = self.cfg.handoff_lead_s + 2 * self.cfg.poll_interval_s
        step_s, h = typical_step_s(self.progress.latest.values()), self.job.compression.sync_every
        at = pause_step(self.progress.step(plan), step_s, lead_s, self.job.steps, h)
        if at is None:
            return action, reason  # too close to the end: finish instead (the leavers wait for it)
        await self._publish_plan(plan.model_copy(update={"stop_at": at, "issued_at": get_dht_time()}))
        self.last_reason = f"{why}: pausing after step {at}"
        logger.info("plan epoch %d pauses: %s", plan.epoch, self.last_reason)
        if self.on_plan is not None:
            self.on_plan(self.plan or plan, self.last_reason)
        return "paused", self.last_reason

    def _links_pending(self) -> bool:
        """Before the first plan: give the peers' first link reports up to ``link_wait_s`` to arrive."""
        if self.plan is not None or len(self.state.peers) < self.job.min_peers:
            self._enough_since = None
            return False
        now = time.monotonic()
        self._enough_since = self._enough_since or now
        reported = sum(1 for p in self.state.peers if p in self.state.links)
        return reported < len(self.state.peers) and now - self._enough_since < self.cfg.link_wait_s

    async def _tend_joiners(self) -> None:
        """Name the peers the plan does not place as spares, with why, by re-publishing the SAME epoch
        (placed peers act only on a higher one; a newcomer takes it and reports "waiting"); at most every
        ``join_check_s``, price placing them (a planner search, off the loop) and re-plan when it pays."""
        plan = self.plan
        if plan is None or plan.status != "training":
            return
        step = self.progress.step(plan)
        spares = self.joins.spares(plan, self.state, self.job, step)
        if spares != plan.spares:
            plan = plan.model_copy(update={"spares": spares, "issued_at": get_dht_time()})
            await self._publish_plan(plan)
            told = "; ".join(f"{s.peer_id[:12]}: {s.reason}" for s in spares if s not in self.joins.base)
            logger.info("plan epoch %d re-published with its spares: %s", plan.epoch, told or "none")
            if self.on_plan is not None:
                self.on_plan(plan, f"spares of epoch {plan.epoch} updated")
        if step <= plan.start_step:
            # Not before every placed peer committed a step of this plan: a hand-off now races the
            # plan's own start (churn run M: after most kills the repair was followed within a second
            # by a plan placing the kill's replacement from a step the repair never reached, which
            # failed, and a third plan went back to the repair's start: 2-3 s lost per kill).
            return
        newcomers = self.joins.newcomers(plan, self.state, self.job)
        if not self.joins.due(newcomers, time.monotonic()):
            return
        speeds = self._speeds()
        decision, reason, ev = await asyncio.to_thread(
            self.joins.evaluate,
            self.state,
            self.job,
            plan,
            step,
            speeds,
            newcomers,
            get_dht_time(),
            time.monotonic(),
            typical_step_s(self.progress.latest.values(), default=0.0),  # 0: not measured yet
            self.ratios.update(self.plan, self.job, self.progress.latest.values()),
        )
        logger.info("newcomer(s) %s: %s", ", ".join(p[:12] for p in newcomers), reason)
        still = self.plan is not None and self.plan.epoch == plan.epoch  # no re-plan meanwhile
        if decision == "improve" and still and ev.plan is not None and ev.placement is not None:
            await self._read_progress()  # the swarm trained on during the search: start from where it is
            await self._replan(reason, handoff=True, candidate=(ev.plan, ev.placement))

    def _speeds(self) -> dict[str, float]:
        claims = {p: device_of(v.record).tflops for p, v in self.state.peers.items()}
        return self.speeds.update(self.plan, self.job, self.progress.compute_s, claims)

    async def _read_progress(self) -> None:
        assert self.node is not None
        records = [v.record for v in await self.node.fetch(self.keys.progress)]
        self.progress.update(self.plan, [r for r in records if isinstance(r, Progress)])

    async def _convict(self) -> bool:
        """Ban the placed peers their stage's replicas testify against (``job/accuse.py``) and re-plan
        without them; True when it did."""
        assert self.plan is not None
        plan = self.plan
        rechecked = [j for j in range(len(plan.stages)) if gradients_rechecked(self.job, plan, j)]
        found = [
            (p, why)
            for p, why in hostile_peers(plan, self.progress.latest.values(), self.accuse, rechecked)
            if p not in self.policy.banned
        ]
        for peer, why in found:
            self.ban(peer, why)
        if found:
            self.state = self.state.without([p for p, _ in found])
            await self._replan(f"banned {', '.join(p[:12] for p, _ in found)}", handoff=True)
        return bool(found)

    def _handoff_start(self, start: int) -> int:
        """``start`` moved ahead for a re-plan nothing failed for, when it came from live state (not from
        a checkpoint, nor the seeded init: then the peers stand still, or restart, at ``start``).
        ``_resume_step`` just decided where ``start`` came from (``resume_from``)."""
        if self.resume_from != "live" or start == 0:
            return start
        lead_s = self.cfg.handoff_lead_s + 2 * self.cfg.poll_interval_s
        step_s = typical_step_s(self.progress.latest.values())
        moved, why = handoff_step(start, step_s, lead_s, self.job.steps)
        logger.info("%s", why)
        return moved

    def _settle(self, now: float) -> bool:
        """True while a re-plan may still wait for live peers' reports (``RESUME_SETTLE_S``)."""
        self._settle_since = self._settle_since if self._settle_since is not None else now
        return now - self._settle_since < RESUME_SETTLE_S

    async def _replan(
        self,
        why: str,
        failed: bool = False,
        handoff: bool = False,
        candidate: tuple[TrainPlan, PlacementPlan] | None = None,
    ) -> None:
        """Plan (or re-plan) and publish. ``handoff``: nobody failed (a graceful leave, placing a
        joiner): leaving peers still hold their state, and the plan starts a few steps ahead so the old
        plan's peers stop there together. ``candidate``: a plan already searched (``_tend_joiners``)."""
        if self._links_pending():
            self.last_reason = "enough peers; waiting briefly for their link measurements"
            return
        epoch = self.first_epoch if self.plan is None else self.plan.epoch + 1
        speeds = self._speeds()
        now = get_dht_time()
        # Suspects that did not heartbeat since a peer failed to reach them sit this plan out.
        _, excluded = self.progress.verdicts(self.state, now, self.retry)
        excluded = [p for p in excluded if p in self.state.peers]
        state = self.state.without(excluded)
        live = set(state.peers) | (set(self.state.leaving) if handoff else set())  # leavers still hold it
        start = self._resume_step(live)
        held = max((h.step for p, h in self.progress.holdings.items() if p in live), default=0)
        if start < held and self._settle(time.monotonic()):
            # Live peers hold newer state than any step every layer is known at: their exact reports
            # (a failed run says what it holds) are on their way. Restarting from an older checkpoint,
            # or the seeded init, would throw their training away (run O restarted from step 0 a swarm
            # that had trained to step 977), so wait for them, a few seconds at most.
            self.last_reason = f"waiting up to {RESUME_SETTLE_S:.0f} s for live peers' reports of step {held}"
            return
        self._settle_since = None
        if handoff:
            start = self._handoff_start(start)
        plan: TrainPlan | None
        placement: PlacementPlan | None
        if candidate is not None and not set(candidate[0].peers) <= set(state.peers):
            # searched before a suspicion excluded one of its peers (run N: a dead peer placed by such a
            # plan made the next re-plan find no live holder and restart from step 0): search again
            candidate = None
        if candidate is not None:
            found, placement = candidate
            plan = found.model_copy(update={"epoch": epoch, "start_step": start, "issued_at": now})
            reason = "a fresh plan with the newcomers"
        else:
            plan, placement, reason = await asyncio.to_thread(
                make_train_plan,
                state,
                self.job,
                now,
                epoch,
                start,
                self.placement,
                None,
                speeds,
                frozenset(self.speeds.distrusted),
                self.ratios.update(self.plan, self.job, self.progress.latest.values()),
                # a bottleneck job's positions, fixed by earlier plans: a moved cut keeps its maps
                self.plan.bottleneck_cuts if self.plan is not None else None,
            )
        if plan is None:
            if reason != self.last_reason:
                logger.info("not planning yet: %s", reason)
            self.last_reason = reason
            return
        plan = plan.model_copy(update={"resume_from": self.resume_from})  # where peers look first
        if excluded:
            why = "suspected: unreachable, and no heartbeat since"
            spares = plan.spares + [Spare(peer_id=p, reason=why) for p in excluded]
            plan = plan.model_copy(update={"spares": spares})
            reason = f"{reason}; left out {len(excluded)} suspect(s)"
        self.placement = placement
        self.progress.new_epoch(failed)
        await self._publish_plan(plan)
        self.joins.new_plan(plan)
        self.last_reason = f"{why} -> {reason}"
        logger.info("published plan epoch %d from step %d: %s", epoch, start, self.last_reason)
        if self.on_plan is not None:
            self.on_plan(plan, self.last_reason)

    async def stop(self) -> None:
        """Stop the loops (each within ``aio.DEFAULT_GRACE_S``), a checkpoint copy under way, the state
        server, then the DHT node."""
        if self.owner is not None:
            await self.owner.close()
            self.owner = None
        if self._running is not None:
            self._running.cancel()
            await asyncio.wait({self._running})
            self._running = None
        if self.node is not None:
            await self.node.shutdown()
            self.node = None
