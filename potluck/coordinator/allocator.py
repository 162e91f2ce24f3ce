"""The swarm coordinator's allocator: which peers serve which job, round by round (docs/multijob.md).

Each poll it reads the jobs offered to the swarm (``JobOffer`` records of owners the admission desk
gave the job to), their specs and progress, and calls the pure ``allocation.allocate`` with the live
peers; it signs and publishes the ``Allocation`` when the leases changed, and every third of its
lifetime otherwise. While the swarm has one job left, and it is the swarm's own, nothing is published:
the last record lapses and every peer serves that job again, as in a one-job swarm.

The record is the mechanism's memory (received and present seconds): a coordinator restarted within
its lifetime reads it back (``restore``) and carries on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from potluck.aio import bounded
from potluck.coordinator.admission import AdmissionDesk
from potluck.coordinator.allocation import (
    AllocationError,
    AllocConfig,
    ChurnStats,
    JobDemand,
    PairKey,
    PeerInfo,
    RateEstimate,
    allocate,
    classify,
    estimate,
    group,
    is_cotenant,
    observe,
    shared_devices,
    watch_churn,
)
from potluck.coordinator.config import AllocatorConfig
from potluck.coordinator.job.lease import job_scale
from potluck.coordinator.state import SwarmState
from potluck.net.node import SwarmNode
from potluck.protocol.allocation import Allocation, JobOffer
from potluck.protocol.errors import AdmissionError
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import ALLOCATION, JOBS, JobKeys
from potluck.protocol.training import Progress

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobStatus:
    """One job as the allocator sees it this poll."""

    spec: JobSpec
    weight: float
    step: int  # the newest step its peers reported
    arrival: float  # DHT time it was offered (the swarm's own job: 0)


class Allocator:
    def __init__(
        self, node: SwarmNode, home: JobSpec, cfg: AllocatorConfig, desk: AdmissionDesk, timeout_s: float
    ) -> None:
        self.node, self.home, self.cfg, self.desk, self.timeout_s = node, home, cfg, desk, timeout_s
        self.record: Allocation | None = None  # the allocation in force (None: one job, no leases)
        self.reason = ""
        self.jobs: dict[str, JobStatus] = {}  # the unfinished jobs of the last poll
        self.offers: dict[str, JobOffer] = {}  # job -> its owner's newest offer
        self._specs: dict[str, JobSpec] = {}
        self._measured: dict[tuple[str, str], RateEstimate] = {}
        self._measured_pairs: dict[PairKey, RateEstimate] = {}  # (job, its pair, class): co-located rates
        self._last_step: dict[str, tuple[int, float]] = {}  # job -> (step, DHT time) at the last poll
        self._published_at = -1e9  # monotonic
        self._lapsing: tuple[Allocation, float] | None = None  # the last record, until it expires (DHT time)
        self._refused: set[tuple[str, str]] = set()  # (job, owner) offers refused, logged once
        # Churn per class (``allocation.watch_churn``): the live peers' classes at the last poll (and its
        # DHT time); the rates of classes whose peers leave are discounted
        self.churn: dict[str, ChurnStats] = {}
        self._seen: tuple[dict[str, str], float] | None = None

    async def restore(self) -> None:
        """Carry on from the newest allocation in the DHT (a restarted coordinator)."""
        found = await bounded(self.node.read_allocation(), self.timeout_s, "reading the allocation")
        if found is not None:
            self.record = found
            logger.info("carrying on with allocation round %d", found.round)

    def in_force(self, now: float) -> Allocation | None:
        """The leases the swarm's own job follows: the current record, or after the allocation ended
        the last one until it expires, as peers see it in the DHT (everyone moves back together)."""
        if self.record is not None:
            return self.record
        if self._lapsing is not None and now < self._lapsing[1]:
            return self._lapsing[0]
        return None

    def others_unfinished(self) -> list[str]:
        """The offered jobs still running (the swarm's coordinator serves until they are done)."""
        return sorted(j for j in self.jobs if j != self.home.name)

    async def tick(
        self,
        swarm: SwarmState,
        home_step: int,
        home_done: bool,
        now: float,
        placed: frozenset[str] = frozenset(),
    ) -> None:
        """One poll: read the offered jobs, allocate, publish when it changed (see the module docstring).
        ``placed``: the peers the swarm's own job's plan places (its incumbents in the first round)."""
        others = await self._read_jobs()
        jobs = dict(others)
        if not home_done:
            jobs[self.home.name] = JobStatus(self.home, self.cfg.weight, home_step, 0.0)
        self.jobs = jobs
        if not others:
            if self.record is not None:
                logger.info("one job left on the swarm: leases end, every peer serves %s", self.home.name)
            self.record = None
            return
        records = {p: swarm.peers[p].record for p in swarm.peers if p not in swarm.leaving}
        shared = shared_devices(records)  # device peer -> its co-tenant (both records name each other)
        peers = [
            self._peer_info(swarm, p, shared.get(p)) for p in sorted(records) if not is_cotenant(records[p])
        ]
        self._observe(now)
        self._watch(peers, now)
        demands = [
            JobDemand(
                job=name,
                scale=self._scale(st.spec),
                weight=st.weight,
                remaining_steps=max(st.spec.steps - st.step, 1),
                arrival=st.arrival,
            )
            for name, st in sorted(jobs.items())
        ]
        classes = group(peers)
        scaled = {d.job: (jobs[d.job].spec, d.scale) for d in demands}
        tp = estimate(
            scaled,
            classes,
            self._measured,
            self.churn,
            self.cfg.handoff_s,
            measured_pairs=self._measured_pairs,
        )
        policy = AllocConfig(policy=self.cfg.policy, round_s=self.cfg.round_s, handoff_s=self.cfg.handoff_s)
        prev = self.record if self.record is not None and set(self.record.jobs) else None
        try:
            incumbents = {p: self.home.name for p in placed}  # the first round keeps them where they are
            record, reason = allocate(now, demands, peers, tp, policy, prev, incumbents)
        except AllocationError as e:
            logger.warning("allocation failed: %s; the leases in force run on", e)
            return
        changed = prev is None or record.round != prev.round or record.leases != prev.leases
        self.record, self.reason = record, reason
        if changed:
            shown = "; ".join(f"{'+'.join(x.jobs)}: {len(x.peers)} peer(s)" for x in record.leases)
            logger.info("allocation %s [%s]", reason, shown or "no leases")
        if changed or time.monotonic() - self._published_at > self.cfg.ttl_s / 3:
            if await self.node.publish(ALLOCATION.name, record, self.cfg.ttl_s):
                self._published_at = time.monotonic()
                self._lapsing = (record, now + self.cfg.ttl_s)
            else:
                logger.warning("allocation round %d stored by no DHT node yet", record.round)

    def _scale(self, spec: JobSpec) -> int:
        return job_scale(spec.min_peers, spec.limits.stages, spec.limits.replicas)

    def _peer_info(self, swarm: SwarmState, peer: str, cotenant: str | None) -> PeerInfo:
        record = swarm.peers[peer].record
        report = swarm.links.get(peer)
        info = PeerInfo.from_record(record, report.access if report is not None else None, cotenant)
        if self.cfg.classes == "device":
            hw = record.hardware
            name = f"{hw.device_kind}:{_slug(hw.device_name)}" + ("+shared" if cotenant else "")
            return replace(info, peer_class=name)
        return info

    async def _read_jobs(self) -> dict[str, JobStatus]:
        """The admitted, unfinished offered jobs whose spec is readable."""
        found = await bounded(self.node.fetch(JOBS.name), self.timeout_s, "reading the offered jobs")
        out: dict[str, JobStatus] = {}
        for v in found:
            offer = v.record
            if not isinstance(offer, JobOffer) or offer.done or offer.job == self.home.name:
                continue
            try:
                self.desk.claim(offer.job, offer.peer_id)  # a restarted desk learns the owners back
            except AdmissionError as e:
                if (offer.job, offer.peer_id) not in self._refused:
                    logger.warning("offer of job %s by %s refused: %s", offer.job, offer.peer_id[:12], e)
                    self._refused.add((offer.job, offer.peer_id))
                continue
            self.offers[offer.job] = offer
            spec, step = await self._read_job(offer.job)
            if spec is not None and step < spec.steps:
                out[offer.job] = JobStatus(spec, offer.weight, step, offer.submitted_at)
        return out

    async def _read_job(self, job: str) -> tuple[JobSpec | None, int]:
        keys = JobKeys(job, home=False)
        if job not in self._specs:
            specs = await bounded(self.node.fetch(keys.job), self.timeout_s, f"reading job {job}")
            found = [v.record for v in specs if isinstance(v.record, JobSpec)]
            if not found:
                return None, 0
            self._specs[job] = found[0]
        records = await bounded(self.node.fetch(keys.progress), self.timeout_s, f"reading {job} progress")
        steps = [v.record.step for v in records if isinstance(v.record, Progress)]
        return self._specs[job], max(steps, default=0)

    def _watch(self, peers: list[PeerInfo], now: float) -> None:
        """Count this poll's departures and watched peer-seconds per class (``watch_churn``)."""
        classes = {p.peer_id: classify(p) for p in peers}
        if self._seen is not None:
            before, at = self._seen
            self.churn = watch_churn(self.churn, before, classes, now - at)
        self._seen = (classes, now)

    def _observe(self, now: float) -> None:
        """Fold each leased job's steps since the last poll into its measured rate on its lease's class."""
        held = {
            j: (tuple(sorted(lease.jobs)), lease.peer_class)
            for lease in (self.record.leases if self.record else [])
            for j in lease.jobs
        }
        for job, st in self.jobs.items():
            last = self._last_step.get(job)
            self._last_step[job] = (st.step, now)
            if last is None or job not in held or st.step <= last[0]:
                continue
            row, peer_class = held[job]
            steps, seconds = st.step - last[0], now - last[1]
            if len(row) == 2:  # a space-shared lease: the job's rate in that pair, on that class
                pair_key = (job, (row[0], row[1]), peer_class)
                est = observe(self._measured_pairs.get(pair_key), steps, seconds)
                self._measured_pairs[pair_key] = est
                other = row[1] if row[0] == job else row[0]
                logger.log(
                    logging.INFO if est.samples == 1 else logging.DEBUG,
                    "co-located rate of %s with %s on %s: %.3f steps/s",
                    job,
                    other,
                    peer_class,
                    est.rate,
                )
                continue
            key = (job, peer_class)
            self._measured[key] = observe(self._measured.get(key), steps, seconds)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")[:48] or "unknown"
