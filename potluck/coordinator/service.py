"""The coordinator service: owns the swarm's DHT entry point, publishes the signed job, tracks peers.

I/O lives here; what it decides from the state (the plan) is computed by pure functions elsewhere.
Its loops run as named tasks under ``aio.supervise``: a crash of one is logged with its name, stops
the others and ends the job with ``error`` set, instead of leaving a service that silently stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from hivemind.utils import get_dht_time

from potluck import logs
from potluck.aio import bounded, supervise
from potluck.coordinator import admission, rejoin
from potluck.coordinator.admission import AdmissionDesk
from potluck.coordinator.allocator import Allocator
from potluck.coordinator.config import CoordinatorConfig
from potluck.coordinator.copies import OwnerCopy
from potluck.coordinator.errors import CoordinatorError
from potluck.coordinator.events import Events, JobLoad, Moment, PeersChanged
from potluck.coordinator.job.lease import leased_state
from potluck.coordinator.job.progress import JobProgress
from potluck.coordinator.kinds import JobDriver, JobKinds
from potluck.coordinator.pipeline import PipelineJob
from potluck.coordinator.state import SwarmState
from potluck.errors import TaskFailed
from potluck.net.admit import admitted
from potluck.net.node import SwarmNode
from potluck.net.streams import Streams
from potluck.protocol.admission import JoinToken
from potluck.protocol.allocation import Allocation
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.identity import Identity
from potluck.protocol.invite import Invite
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import LINKS, PEERS, JobKeys
from potluck.protocol.training import TrainPlan
from potluck.telemetry.summary import Throughput

logger = logging.getLogger(__name__)

BUILT_IN: JobKinds = {"pipeline": PipelineJob}  # other kinds are handed in (``kinds.py``)


class CoordinatorService:
    """One job's coordinator: its swarm-facing core, and the driver of the job's kind (``kinds.py``)."""

    first_epoch = 1  # the epoch of the first plan (higher after a restart: the driver recovers it)
    _memory: rejoin.Memory | None = None  # what a restart needs, on disk (set by start())

    def __init__(
        self,
        cfg: CoordinatorConfig,
        job: JobSpec,
        identity: Identity | None = None,
        join: Invite | None = None,
        kinds: JobKinds | None = None,
    ) -> None:
        """``join``: add ``job`` to the running swarm of this invite (``potluck launch --join``): this
        process is the job's coordinator, signing its records as the job's owner; the swarm's own
        coordinator admits the job and allocates peers to it (``allocator.py``). ``kinds``: the job kinds
        this coordinator can run besides the built-in pipeline."""
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
        self.events = Events()  # peers joined or left, plans published, progress read (``events.py``)
        self.finished = asyncio.Event()  # set when the job reached its last step everywhere
        self.last_reason = ""
        self.error: str | None = None  # set when the job was given up (finished is set too)
        self._running: asyncio.Task[None] | None = None  # the supervisor of the service's loops
        self.owner: OwnerCopy | None = None  # the job owner's checkpoint copy: served, kept current
        known = {**BUILT_IN, **(kinds or {})}
        if job.kind not in known:
            raise CoordinatorError(f"job {job.name} is a {job.kind} job, which this coordinator cannot run")
        self.driver: JobDriver = known[job.kind](self)

    @property
    def plan(self) -> TrainPlan | None:
        """The pipeline plan in force (None before the first, and for other kinds)."""
        return self.driver.plan

    @property
    def progress(self) -> JobProgress:
        return self.driver.progress

    def moment(self) -> Moment:
        """What this coordinator knows now: the input of its telemetry and of every view of the job."""
        allocator = self.allocator
        jobs = {
            name: JobLoad(j.weight, j.step, j.spec.steps)
            for name, j in (allocator.jobs.items() if allocator is not None else [])
        }
        return Moment(
            self.job,
            self.plan,
            self.progress,
            self.state,
            self.last_reason,
            self.finished.is_set(),
            self.error,
            self.allocation,
            jobs,
            self.throughput(),
        )

    def throughput(self) -> Throughput | None:
        """The job's tokens/s and ETA, the one figure every view shows (``telemetry.summary``)."""
        rate = self.driver.rate
        return rate.view() if rate is not None else None

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
            await self.driver.recover(saved.plan if saved is not None else None, joined)
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
        """At the job's end: nothing to withdraw here (a joined job's offer: ``joined.py``)."""

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
            streams,
            self.cfg.swarm_id,
            self.identity,
            self.job,
            root,
            copy_mb_s,
            self._may_fetch,
            self.cfg.corpus,
        )
        await self.owner.start()

    def _run(self, tasks: dict[str, Coroutine[Any, Any, None]]) -> None:
        """Supervise ``tasks`` plus, when training, the job kind's own loops."""
        if self.cfg.train:
            tasks |= self.driver.loops()
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
                if joined or left:
                    self.events.emit(PeersChanged(state, joined, left))
            await asyncio.sleep(self.cfg.poll_interval_s)

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
