"""A job added to a running swarm (``potluck launch --join``): its coordinator's side of the swarm.

The job's owner runs a coordinator of its own for the job (plans, progress, checkpoint copies), as in a
one-job swarm, but it joins the swarm through the invite and is not the swarm's coordinator:

- it trades the invite's token for an admission that names the job (``admission.owner_role``), so its
  signature on the job's spec and plans is accepted by every node (``envelope.check_owner``), renewed
  at half its life; it honours the swarm's ban list;
- it offers the job to the swarm's allocator with a signed ``JobOffer`` (its priority weight), kept
  fresh, and marked done at the job's end;
- it plans only over the peers the allocator leases to the job (``job/lease.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

from hivemind.utils import get_dht_time

from potluck import logs
from potluck.aio import bounded
from potluck.coordinator.config import AllocatorConfig, CoordinatorConfig
from potluck.coordinator.kinds import JobKinds
from potluck.coordinator.service import CoordinatorService
from potluck.net.admit import ask_admission
from potluck.net.node import SwarmNode
from potluck.net.streams import Streams
from potluck.protocol.admission import Admission
from potluck.protocol.allocation import JobOffer
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.errors import AdmissionError, WireError
from potluck.protocol.identity import Identity, peer_id_from_public_key
from potluck.protocol.invite import Invite
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import JOBS

logger = logging.getLogger(__name__)

ADMIT_TIMEOUT_S = 10.0  # bound on one admission request to the swarm's coordinator
ADMIT_RETRY_S = 2.0


async def ask_owner_admission(node: SwarmNode, invite: Invite, job: str, within_s: float) -> Admission:
    """The swarm coordinator's admission of this key as ``job``'s owner, asked until ``within_s``
    passed while the coordinator cannot be reached; ``AdmissionError`` when it refuses."""
    coordinator = peer_id_from_public_key(invite.coordinator_key)
    deadline = time.monotonic() + within_s
    while True:
        try:
            adm = await ask_admission(
                Streams(node.p2p), coordinator, invite.swarm_id, invite.token, ADMIT_TIMEOUT_S, job=job
            )
            break
        except WireError as e:
            if time.monotonic() + ADMIT_RETRY_S > deadline:
                raise AdmissionError(f"the swarm's coordinator did not answer: {e}") from None
            await asyncio.sleep(ADMIT_RETRY_S)
    node.admission = adm.encode()
    return adm


async def join_as_owner(
    identity: Identity, policy: TrustPolicy, cfg: CoordinatorConfig, invite: Invite, job: str
) -> SwarmNode:
    """Join the invite's swarm and be admitted as ``job``'s owner (before anything is published)."""
    node = await SwarmNode.start(
        identity,
        policy,
        cfg.net,
        tuple(invite.bootstrap) + cfg.initial_peers,
        key_dir=cfg.identity_path.parent,
    )
    try:
        adm = await ask_owner_admission(node, invite, job, cfg.net.bootstrap_timeout_s)
    except BaseException:
        await node.shutdown()
        raise
    logger.info(
        "admitted to swarm %s as the owner of job %s until %s", invite.swarm_id, job, time.ctime(adm.expires)
    )
    return node


async def keep_admitted(node: SwarmNode, cfg: CoordinatorConfig, invite: Invite, job: str) -> None:
    """Renew the owner's admission at half its life, and follow the swarm's ban list."""
    granted = Admission.decode(node.admission)
    life = granted.expires - get_dht_time()
    while True:
        await asyncio.sleep(cfg.poll_interval_s * 5)
        try:
            bans = await bounded(node.read_bans(), cfg.read_timeout_s, "reading the ban list")
            node.policy.banned.clear()
            node.policy.banned.update(bans)
            if granted.expires - get_dht_time() < life / 2:
                granted = await ask_owner_admission(node, invite, job, cfg.read_timeout_s)
                life = granted.expires - get_dht_time()
        except AdmissionError as e:
            logger.warning("admission as the owner of %s not renewed: %s", job, e)
        except Exception:
            logger.exception("keeping the owner's admission failed")


class Offerer:
    """Keeps the job's ``JobOffer`` in the DHT (``offer_ttl_s``, re-published every third of it)."""

    def __init__(self, node: SwarmNode, job: str, cfg: AllocatorConfig) -> None:
        self.node, self.job, self.cfg = node, job, cfg
        self.submitted_at = get_dht_time()

    def offer(self, done: bool) -> JobOffer:
        return JobOffer(
            peer_id=self.node.identity.peer_id,
            job=self.job,
            weight=self.cfg.weight,
            submitted_at=self.submitted_at,
            done=done,
            issued_at=get_dht_time(),
        )

    async def publish(self, done: bool) -> bool:
        ttl = self.cfg.offer_ttl_s
        return await self.node.publish(JOBS.name, self.offer(done), ttl, self.node.identity.peer_id)

    async def run(self, finished: asyncio.Event) -> None:
        """Offer the job until ``finished``; then say it is done (the allocator frees its peers)."""
        while not finished.is_set():
            try:
                if not await self.publish(False):
                    logger.warning("job offer stored by no DHT node yet")
            except Exception:
                logger.exception("publishing the job offer failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), self.cfg.offer_ttl_s / 3)
        try:
            await self.publish(True)
        except Exception:
            logger.exception("publishing the job's end failed")


# The service of a job added to someone else's swarm: it joins through the invite as the job's owner,
# plans only the peers the swarm's allocator leases to the job, and offers the job to that allocator
# until the job ends.
logger = logging.getLogger(__name__)


class JoinedJobService(CoordinatorService):
    """A ``CoordinatorService`` whose swarm is someone else's: no admission desk of its own, no
    allocator, no memory on disk (it rejoins through the invite)."""

    def __init__(
        self,
        cfg: CoordinatorConfig,
        job: JobSpec,
        invite: Invite,
        identity: Identity | None = None,
        kinds: JobKinds | None = None,
    ) -> None:
        super().__init__(cfg, job, identity, join=invite, kinds=kinds)
        self.invite = invite
        self.offerer: Offerer | None = None  # the job's offer to the swarm's allocator

    async def start(self) -> Invite:
        """Join the swarm as the job's owner, recover the job's plan if it has one, publish its spec and
        offer it to the swarm's allocator; returns the swarm's invite."""
        logs.bind(peer_id=self.identity.peer_id, swarm_id=self.cfg.swarm_id)
        invite, name = self.invite, self.job.name
        self.node = await join_as_owner(self.identity, self.policy, self.cfg, invite, name)
        if self.cfg.train:
            await self.driver.recover(None, True)
        if not await self.node.publish(self.keys.job, self.job, self.cfg.job_ttl_s):
            logger.warning("job spec stored by no DHT node yet")
        streams, node = Streams(self.node.p2p), self.node
        streams.credentials = lambda: node.admission  # the peers serve admitted keys only
        await self._start_owner_copy(streams)
        offer = self.offerer = Offerer(self.node, name, self.cfg.alloc)
        tasks: dict[str, Coroutine[Any, Any, None]] = {
            "refresh-job": self._refresh_job(),
            "track-peers": self._track_peers(),
            "admission": keep_admitted(self.node, self.cfg, invite, name),
            "offer": offer.run(self.finished),
        }
        self._run(tasks)
        return invite

    async def end_offer(self) -> None:
        """At the job's end: the offer says done (the allocator frees its peers)."""
        if self.offerer is not None and self.node is not None:
            await self.offerer.publish(True)
