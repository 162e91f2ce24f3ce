"""Read-only access to a swarm for tools (``potluck status``, the demo, monitors): join as a DHT client
with a throwaway identity, read, leave."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field, replace

from hivemind.utils import get_dht_time

from potluck.aio import bounded
from potluck.net.config import NetworkConfig
from potluck.net.node import SwarmNode
from potluck.protocol.allocation import Allocation, JobOffer
from potluck.protocol.classpar import ClassParPlan
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.identity import Identity
from potluck.protocol.invite import Invite
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import CLASSPAR, JOB, JOBS, LINKS, PEERS, PLAN, PROGRESS, JobKeys
from potluck.protocol.membership import PeerView, link_reports, live_peers
from potluck.protocol.records import LinkReport
from potluck.protocol.training import Progress, TrainPlan

MAX_JOBS_SHOWN = 16  # added jobs whose plans a reading fetches


class SwarmClient:
    def __init__(self, node: SwarmNode) -> None:
        self.node = node

    @classmethod
    async def connect(cls, invite: Invite, net: NetworkConfig) -> SwarmClient:
        # A client listens on loopback only: it serves nothing and must not be dialled from outside.
        net = replace(net, host_maddrs=("/ip4/127.0.0.1/tcp/0",), announce_maddrs=())
        # It shows what the swarm's peers accept: admitted peers' records, none of a banned peer's.
        policy = TrustPolicy(invite.swarm_id, invite.coordinator_key, require_admission=True)
        node = await SwarmNode.start(Identity.generate(), policy, net, invite.bootstrap, client_mode=True)
        with contextlib.suppress(TimeoutError):  # no list read is read as no bans
            policy.banned.update(
                await bounded(node.read_bans(), net.request_timeout_s, "reading the ban list")
            )
        return cls(node)

    async def live_peers(self, timeout_s: float) -> list[PeerView]:
        records = await bounded(self.node.fetch(PEERS.name), timeout_s, "reading the live peers")
        return live_peers(records, get_dht_time())

    async def links(self, live_ids: list[str], timeout_s: float) -> dict[str, LinkReport]:
        records = await bounded(self.node.fetch(LINKS.name), timeout_s, "reading the link reports")
        return link_reports(records, live_ids, get_dht_time())

    async def job(
        self, timeout_s: float, keys: JobKeys | None = None
    ) -> tuple[TrainPlan | None, list[Progress]]:
        """The newest verified plan and the progress records of its epoch (training state) of the
        swarm's own job, or of the job whose ``keys`` are given."""
        plan_key, progress_key = (
            (keys.plan, keys.progress) if keys is not None else (PLAN.name, PROGRESS.name)
        )
        plans, progress = await bounded(
            asyncio.gather(self.node.fetch(plan_key), self.node.fetch(progress_key)),
            timeout_s,
            "reading the plan and progress",
        )
        plan = max(
            (v.record for v in plans if isinstance(v.record, TrainPlan)), key=lambda p: p.epoch, default=None
        )
        recs = [v.record for v in progress if isinstance(v.record, Progress)]
        if plan is not None:
            # a "done" plan re-publishes the last training epoch's layout under epoch + 1
            recs = [r for r in recs if r.epoch in (plan.epoch, plan.epoch - 1) and r.job == plan.job]
        return plan, sorted(recs, key=lambda r: (r.stage, r.replica, r.peer_id))

    async def job_spec(self, timeout_s: float) -> JobSpec | None:
        """The swarm's own job as its coordinator signed it (None: not readable)."""
        found = await bounded(self.node.fetch(JOB.name), timeout_s, "reading the job")
        return next((v.record for v in found if isinstance(v.record, JobSpec)), None)

    async def classpar(self, timeout_s: float) -> ClassParPlan | None:
        """The swarm's class-parallel plan (None: its job is a pipeline job, or none is readable)."""
        found = await bounded(self.node.fetch(CLASSPAR.name), timeout_s, "reading the class-parallel plan")
        plans = [v.record for v in found if isinstance(v.record, ClassParPlan)]
        return max(plans, key=lambda p: p.epoch, default=None)

    async def jobs(self, timeout_s: float) -> tuple[Allocation | None, list[JobOffer]]:
        """The allocation in force (None: a one-job swarm) and the jobs offered to the swarm."""
        newest, offers = await bounded(
            asyncio.gather(self.node.read_allocation(), self.node.fetch(JOBS.name)),
            timeout_s,
            "reading the allocation and the offered jobs",
        )
        return newest, sorted(
            (v.record for v in offers if isinstance(v.record, JobOffer)), key=lambda o: o.job
        )

    async def close(self) -> None:
        await self.node.shutdown()


async def read_live_peers(invite: Invite, net: NetworkConfig, timeout_s: float) -> list[PeerView]:
    client = await SwarmClient.connect(invite, net)
    try:
        return await client.live_peers(timeout_s)
    finally:
        await client.close()


@dataclass(frozen=True)
class SwarmReading:
    """What ``potluck status`` shows: peers, links, the swarm's own job and the jobs added to it."""

    peers: list[PeerView]
    links: dict[str, LinkReport]
    plan: TrainPlan | None
    progress: list[Progress]
    allocation: Allocation | None = None
    offers: list[JobOffer] = field(default_factory=list)
    # each added job's newest plan and progress (job -> (plan, progress))
    others: dict[str, tuple[TrainPlan | None, list[Progress]]] = field(default_factory=dict)
    classpar: ClassParPlan | None = None  # the swarm's own job's plan when it is a class-parallel job
    spec: JobSpec | None = None  # the swarm's own job, as signed


async def read_swarm(invite: Invite, net: NetworkConfig, timeout_s: float) -> SwarmReading:
    """Live peers, their latest link reports, the plan and its progress, and the jobs on the swarm
    with the allocation in force, in one client session."""
    client = await SwarmClient.connect(invite, net)
    try:
        peers = await client.live_peers(timeout_s)
        links = await client.links([p.peer_id for p in peers], timeout_s)
        plan, progress = await client.job(timeout_s)
        allocation, offers = await client.jobs(timeout_s)
        others = {
            o.job: await client.job(timeout_s, JobKeys(o.job, home=False)) for o in offers[:MAX_JOBS_SHOWN]
        }
        classpar = await client.classpar(timeout_s)
        spec = await client.job_spec(timeout_s)
        return SwarmReading(peers, links, plan, progress, allocation, offers, others, classpar, spec)
    finally:
        await client.close()
