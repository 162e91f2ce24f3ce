"""Following the lease on a swarm of several jobs (docs/multijob.md): the DHT reads and the move's
bookkeeping around ``lease.py``'s pure rules. The worker asks ``target()`` each poll and moves once
``leave.leave_verdict`` says the job it leaves no longer needs it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from potluck.net.node import SwarmNode
from potluck.peer.lease import HOME, describe, keys_of, leased_job
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import JOB, JobKeys
from potluck.protocol.training import Progress, TrainPlan

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Move:
    """A move under way: to ``target`` (None: idle), asked at monotonic ``since``; ``placed_at_start``:
    whether the peer was placed in (or training for) the job it leaves when the move was asked."""

    target: JobKeys | None
    since: float
    placed_at_start: bool


class LeaseFollower:
    """Which job's keys a peer follows, and the move it is making between jobs."""

    def __init__(self, node: SwarmNode, peer_id: str, cotenant: bool = False) -> None:
        """``cotenant``: this peer is the second peer of a shared device (it idles until leased)."""
        self.node, self.peer_id, self.cotenant = node, peer_id, cotenant
        self.keys: JobKeys | None = None if cotenant else HOME  # the job followed (None: idle this round)
        self.home: str | None = None  # the swarm's own job's name, once an allocation made it matter
        self.moving: Move | None = None

    async def target(self) -> JobKeys | None:
        """The keys of the job this peer's lease names (the swarm's own job without an allocation)."""
        allocation = await self.node.read_allocation()
        if allocation is not None and self.home is None:
            jobs = [v.record for v in await self.node.fetch(JOB.name) if isinstance(v.record, JobSpec)]
            if not jobs:
                return self.keys  # which job is the swarm's own is not readable yet: no move
            self.home = jobs[0].name
        return leased_job(allocation, self.peer_id, self.home, self.cotenant)

    def keys_of(self, job: str) -> JobKeys:
        return keys_of(job, self.home)

    def asked(self, target: JobKeys | None, now: float, placed: bool) -> Move:
        """The move to ``target``: the one under way, or a new one from ``now`` (``placed``: whether this
        peer is placed in, or training for, the job it follows)."""
        if self.moving is None or self.moving.target != target:
            self.moving = Move(target, now, placed)
            logger.info("lease: %s from now, after handing over %s", describe(target), describe(self.keys))
        return self.moving

    def moved(self, target: JobKeys | None) -> None:
        self.keys, self.moving = target, None

    async def under_way(self, plan: TrainPlan) -> bool:
        """True once a placed peer of ``plan`` reported a step past its start: commits are all-or-nothing,
        so every peer of the plan then holds its state."""
        records = [v.record for v in await self.node.fetch(self.keys_of(plan.job).progress)]
        mine = [
            r
            for r in records
            if isinstance(r, Progress) and r.epoch == plan.epoch and r.peer_id in plan.peers
        ]
        return any(r.step > plan.start_step for r in mine)
