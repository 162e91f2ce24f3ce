"""The coordinator's telemetry: its status, links and events to MQTT, and the dashboard it hosts.

``swarm_status`` (pure) turns what the service knows (the plan, the progress records, the verified
heartbeats) into the signed ``CoordinatorStatus`` every reader trusts for "who is in the swarm"; its
``members`` are exactly the peers with valid heartbeat records. ``swarm_events`` (pure) compares two
moments and says what happened (re-planned, recovered, joined, left, done). ``CoordinatorTelemetry``
runs both every ``interval_s`` against the live service, feeds its own ``SwarmView`` directly and the
peers' messages from the broker (``Subscriber``), and serves the dashboard.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from potluck.coordinator.events import Moment
from potluck.coordinator.job.plan import network
from potluck.coordinator.state import SwarmState
from potluck.protocol.identity import Identity
from potluck.protocol.telemetry import (
    VERSION,
    CoordinatorLinks,
    CoordinatorStatus,
    Event,
    JobShareView,
    LinkView,
    MemberView,
    StageView,
    coordinator_topic,
    seal_message,
)
from potluck.telemetry.aggregate import SwarmView
from potluck.telemetry.config import MqttTarget, PublisherConfig
from potluck.telemetry.dashboard.server import Dashboard
from potluck.telemetry.publisher import Outgoing, Publisher
from potluck.telemetry.subscriber import Subscriber

logger = logging.getLogger(__name__)

MAX_ESTIMATED = 2000  # links in one message (~400 KB): beyond ~45 peers only the measured ones are sent
LINKS_EVERY_S = 30.0  # the link matrix is sent when it changes, and at least this often (retained)


def swarm_status(m: Moment, peer: str, now: float) -> CoordinatorStatus:
    """Pure: the coordinator's signed-to-be status at ``now``."""
    plan = m.plan
    step = m.progress.step(plan) if plan is not None else 0
    state: Literal["waiting", "training", "done", "failed"] = (
        "failed"
        if m.error
        else "done"
        if m.finished
        else "training"
        if plan is not None and plan.waiting is None  # a plan that lost peers and cannot go on: waiting
        else "waiting"
    )
    loss, sent = None, 0
    tps = m.rate.tokens_per_s if m.rate is not None else 0.0  # the launch summary's figure too
    if plan is not None:
        last = set(plan.stages[-1].peers)
        placed = {p for st in plan.stages for p in st.peers}
        recs = [r for r in m.progress.latest.values() if r.peer_id in placed]
        losses = [(r.step, r.loss) for r in recs if r.peer_id in last and r.loss is not None]
        loss = max(losses)[1] if losses else None
        sent = sum(r.bytes_sent_per_step for r in recs)
    members = {
        p: MemberView(
            device=v.record.hardware.label[:500],
            tflops=v.record.hardware.tflops_fp32,
            memory_bytes=v.record.hardware.memory_total_bytes,
        )
        for p, v in m.state.peers.items()
    }
    return CoordinatorStatus(
        v=VERSION,
        peer=peer,
        at=now,
        job=m.job.name,
        state=state,
        steps=m.job.steps,
        step=step,
        loss=loss,
        tokens_per_s=tps,
        eta_s=m.rate.eta_s if m.rate is not None else None,
        bytes_per_step=sent,
        epoch=plan.epoch if plan is not None else None,
        start_step=plan.start_step if plan is not None else 0,
        stages=[
            StageView(first_layer=s.first_layer, last_layer=s.last_layer, peers=s.peers) for s in plan.stages
        ]
        if plan is not None
        else [],
        spares={s.peer_id: s.reason[:500] for s in plan.spares} if plan is not None else {},
        members=members,
        reason=(m.error or m.reason)[:500],
        jobs=job_shares(m),
        lease_round=m.allocation.round if m.allocation is not None else None,
        lease_end=m.allocation.lease_end if m.allocation is not None else None,
    )


def job_shares(m: Moment) -> list[JobShareView]:
    """Pure: every job on the swarm with its lease and shares (none while the swarm has one job)."""
    a = m.allocation
    if a is None:
        return []
    names = sorted(set(a.jobs) | set(m.jobs))
    return [
        JobShareView(
            job=name,
            own=name == m.job.name,
            weight=m.jobs[name].weight if name in m.jobs else 1.0,
            step=m.jobs[name].step if name in m.jobs else 0,
            steps=m.jobs[name].steps if name in m.jobs else 0,
            peers=a.peers_of(name),
            allocation=sum(a.allocation_of(name).values()),
            received=sum(a.received_share(name).values()),
        )
        for name in names[:256]
    ]


def swarm_links(state: SwarmState, peer: str, now: float) -> CoordinatorLinks:
    """Pure: every link between members as the planner sees it: the measured ones (goodput in MB/s,
    round trip in ms) and, while the matrix stays small enough for one message, the planner's estimates
    for the pairs nobody measured yet (``measured`` False)."""
    peers = sorted(state.peers)
    links: list[LinkView] = []
    if len(peers) >= 2:
        model, _ = network(state, peers)
        with_estimates = len(peers) * (len(peers) - 1) <= MAX_ESTIMATED
        for i, src in enumerate(peers):
            for j, dst in enumerate(peers):
                measured = bool(model.measured[i, j])
                if i == j or not (measured or with_estimates):
                    continue
                links.append(
                    LinkView(
                        src=src,
                        dst=dst,
                        mb_s=float(model.bandwidth_gbps[i, j]) * 125.0,
                        rtt_ms=2.0 * float(model.latency_ms[i, j]),
                        measured=measured,
                    )
                )
    return CoordinatorLinks(v=VERSION, peer=peer, at=now, links=links[:MAX_ESTIMATED])


@dataclass
class Watch:
    """What ``swarm_events`` remembers between looks."""

    epoch: int | None = None
    members: frozenset[str] = frozenset()
    failed_epoch: bool = False  # the current epoch came after a failure: its first step is a recovery
    recovered: bool = True
    ended: bool = False
    since: float = field(default=0.0)


def swarm_events(w: Watch, m: Moment, now: float) -> list[tuple[str, str]]:
    """Pure apart from updating ``w``: (kind, detail) of what changed since the last look."""
    out: list[tuple[str, str]] = []
    members = frozenset(m.state.peers)
    if w.since:  # not on the first look: everyone already there did not just join
        out += [("peer_joined", p) for p in sorted(members - w.members)]
        out += [("peer_left", p) for p in sorted(w.members - members)]
    w.members = members
    plan = m.plan
    if plan is not None and plan.epoch != w.epoch:
        if w.epoch is not None or w.since:
            out.append(("replanned", f"epoch {plan.epoch} from step {plan.start_step}: {m.reason}"[:500]))
        w.failed_epoch = "fail" in m.reason or "left" in m.reason or "suspect" in m.reason
        w.epoch, w.recovered = plan.epoch, False
    if plan is not None and not w.recovered and m.progress.step(plan) > plan.start_step:
        w.recovered = True
        if w.failed_epoch:
            out.append(("recovered", f"epoch {plan.epoch} committed step {m.progress.step(plan)}"))
    if m.finished and not w.ended:
        w.ended = True
        out.append(("job_failed", (m.error or "")[:500]) if m.error else ("job_done", f"{m.job.name} done"))
    w.since = now
    return out


class CoordinatorTelemetry:
    """Publishes the coordinator's view and serves the dashboard; ``look()`` reads the live service."""

    def __init__(
        self,
        identity: Identity,
        swarm_id: str,
        look: Callable[[], Moment],
        target: MqttTarget | None,
        dashboard: tuple[str, int] | None = ("127.0.0.1", 0),
        interval_s: float = 2.0,
    ) -> None:
        self.identity, self.swarm_id, self.look, self.interval_s = identity, swarm_id, look, interval_s
        self.view = SwarmView(swarm_id, identity.public_key)
        self.publisher = (
            Publisher(target, f"potluck-coord-{identity.peer_id[-12:]}", cfg=PublisherConfig())
            if target is not None
            else None
        )
        self.subscriber = Subscriber(target, self.view) if target is not None else None
        self.dashboard = Dashboard(self.view, *dashboard) if dashboard is not None else None
        self._tasks: list[asyncio.Task[None]] = []
        self._watch = Watch()
        self._links_at = 0.0
        self._links_source: object = None  # (reports, members) the last matrix was built from

    async def start(self) -> str | None:
        """Start publishing and serving; returns the dashboard's URL (None: no dashboard)."""
        url = await self.dashboard.start() if self.dashboard is not None else None
        for name, coro in (
            ("mqtt-publisher", self.publisher.run() if self.publisher else None),
            ("mqtt-subscriber", self.subscriber.run() if self.subscriber else None),
            ("coordinator-telemetry", self._loop()),
        ):
            if coro is not None:
                self._tasks.append(asyncio.create_task(coro, name=name))
        return url

    async def stop(self) -> None:
        """Publish the final status, then stop everything; bounded."""
        try:
            self.tick(time.time(), final=True)
            if self.publisher is not None:
                await asyncio.wait_for(self._drain(), 3.0)
        except Exception as e:  # the job is over either way
            logger.info("final telemetry not sent: %s", e)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.dashboard is not None:
            await self.dashboard.stop()

    async def _drain(self) -> None:
        while self.publisher is not None and self.publisher.pending and self.publisher.connected:
            await asyncio.sleep(0.05)

    async def _loop(self) -> None:
        while True:
            try:
                self.tick(time.time())
            except Exception:  # telemetry must never take the coordinator down
                logger.exception("coordinator telemetry failed; trying again")
            await asyncio.sleep(self.interval_s)

    def tick(self, now: float, final: bool = False) -> None:
        m = self.look()
        me = self.identity.peer_id
        status = swarm_status(m, me, now)
        self.view.apply(status, now)
        self._send("status", seal_message(self.identity, status), retain=True)
        # The link matrix (a planner network model, ~20 ms for 8 peers) only when the reports changed.
        source = (frozenset((p, r.issued_at) for p, r in m.state.links.items()), frozenset(m.state.peers))
        if final or source != self._links_source or now - self._links_at >= LINKS_EVERY_S:
            links = swarm_links(m.state, me, now)
            self.view.apply(links, now)
            self._send("links", seal_message(self.identity, links), retain=True)
            self._links_source, self._links_at = source, now
        for kind, detail in swarm_events(self._watch, m, now):
            event = Event(v=VERSION, peer=me, at=now, kind=kind, detail=detail)  # type: ignore[arg-type]
            self.view.apply(event, now)
            self._send("events", seal_message(self.identity, event), qos=1)

    def _send(self, kind: str, payload: bytes, retain: bool = False, qos: int = 0) -> None:
        if self.publisher is not None:
            topic = coordinator_topic(self.swarm_id, kind)  # type: ignore[arg-type]
            self.publisher.send(Outgoing(topic, payload, qos=1 if retain else qos, retain=retain))
