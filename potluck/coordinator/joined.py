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

from hivemind.utils import get_dht_time

from potluck.aio import bounded
from potluck.coordinator.config import AllocatorConfig, CoordinatorConfig
from potluck.net.admit import ask_admission
from potluck.net.node import SwarmNode
from potluck.net.streams import Streams
from potluck.protocol.admission import Admission
from potluck.protocol.allocation import JobOffer
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.errors import AdmissionError, WireError
from potluck.protocol.identity import Identity, peer_id_from_public_key
from potluck.protocol.invite import Invite
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
