"""The coordinator service: owns the swarm's DHT entry point, publishes the signed job, tracks peers.

I/O lives here; what it decides from the state (the plan) is computed by pure functions elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from hivemind.utils import get_dht_time

from potluck.coordinator.config import CoordinatorConfig
from potluck.coordinator.state import SwarmState
from potluck.protocol.dht import SwarmNode
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.identity import Identity
from potluck.protocol.invite import Invite
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import JOB, LINKS, PEERS

logger = logging.getLogger(__name__)


class CoordinatorService:
    def __init__(self, cfg: CoordinatorConfig, job: JobSpec, identity: Identity | None = None) -> None:
        self.cfg, self.job = cfg, job
        self.identity = identity or Identity.load_or_create(cfg.identity_path)
        self.policy = TrustPolicy(cfg.swarm_id, self.identity.public_key)
        self.node: SwarmNode | None = None
        self.state = SwarmState(cfg.swarm_id, 0.0)
        self.on_change: Callable[[SwarmState, list[str], list[str]], None] | None = None
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

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.node is not None:
            await self.node.shutdown()
            self.node = None
