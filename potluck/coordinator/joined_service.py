"""The coordinator of a job added to a running swarm (``potluck launch --join``; ``joined.py`` holds
its parts): it joins through the invite as the job's owner, plans only the peers the swarm's allocator
leases to the job, and offers the job to that allocator until the job ends."""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any

from potluck import logs
from potluck.coordinator import joined
from potluck.coordinator.config import CoordinatorConfig
from potluck.coordinator.service import CoordinatorService
from potluck.net.streams import Streams
from potluck.protocol.identity import Identity
from potluck.protocol.invite import Invite
from potluck.protocol.jobspec import JobSpec

logger = logging.getLogger(__name__)


class JoinedJobService(CoordinatorService):
    """A ``CoordinatorService`` whose swarm is someone else's: no admission desk of its own, no
    allocator, no memory on disk (it rejoins through the invite)."""

    def __init__(
        self, cfg: CoordinatorConfig, job: JobSpec, invite: Invite, identity: Identity | None = None
    ) -> None:
        super().__init__(cfg, job, identity, join=invite)
        self.invite = invite
        self.offerer: joined.Offerer | None = None  # the job's offer to the swarm's allocator

    async def start(self) -> Invite:
        """Join the swarm as the job's owner, recover the job's plan if it has one, publish its spec and
        offer it to the swarm's allocator; returns the swarm's invite."""
        logs.bind(peer_id=self.identity.peer_id, swarm_id=self.cfg.swarm_id)
        invite, name = self.invite, self.job.name
        self.node = await joined.join_as_owner(self.identity, self.policy, self.cfg, invite, name)
        if self.cfg.train:
            await self._recover(None, True)
        if not await self.node.publish(self.keys.job, self.job, self.cfg.job_ttl_s):
            logger.warning("job spec stored by no DHT node yet")
        streams, node = Streams(self.node.p2p), self.node
        streams.credentials = lambda: node.admission  # the peers serve admitted keys only
        await self._start_owner_copy(streams)
        offer = self.offerer = joined.Offerer(self.node, name, self.cfg.alloc)
        tasks: dict[str, Coroutine[Any, Any, None]] = {
            "refresh-job": self._refresh_job(),
            "track-peers": self._track_peers(),
            "admission": joined.keep_admitted(self.node, self.cfg, invite, name),
            "offer": offer.run(self.finished),
        }
        self._run(tasks)
        return invite

    async def end_offer(self) -> None:
        """At the job's end: the offer says done (the allocator frees its peers)."""
        if self.offerer is not None and self.node is not None:
            await self.offerer.publish(True)
