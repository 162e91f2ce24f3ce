"""The swarm as telemetry shows it: one in-memory view that the dashboard, ``/metrics`` and ``potluck
monitor`` all read. Fed verified messages only (``ingest`` checks them; ``apply`` takes messages the
caller made itself); pure apart from the clock it is given.

Which peers are shown: once the coordinator's signed status names the swarm's members (peers whose
heartbeat records it verified in the DHT), only those and the peers of its plan; a message from anyone
else is counted and dropped. Before that (a monitor that has not heard the coordinator yet), every peer
whose messages carry a valid signature of their own id.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from potluck.protocol.errors import RecordError
from potluck.protocol.telemetry import (
    CoordinatorLinks,
    CoordinatorStatus,
    Event,
    PeerMetrics,
    PeerStatus,
    open_message,
)

logger = logging.getLogger(__name__)

HISTORY = 900  # points kept per chart (a point every ~2 s: half an hour)
EVENTS = 200  # recent events kept
SILENT_S = 30.0  # a peer not heard for this long is shown "stale" (it publishes every few seconds)
MAX_PEERS = 4096  # peers remembered; beyond it the least recently heard are forgotten


@dataclass
class PeerEntry:
    status: PeerStatus | None = None
    metrics: PeerMetrics | None = None
    heard: float = 0.0  # unix seconds of its newest message


@dataclass
class SwarmView:
    swarm_id: str
    coordinator_key: bytes | None = None  # from the invite: coordinator messages are checked against it
    coordinator: CoordinatorStatus | None = None
    links: CoordinatorLinks | None = None
    peers: dict[str, PeerEntry] = field(default_factory=dict)
    events: deque[Event] = field(default_factory=lambda: deque(maxlen=EVENTS))
    series: deque[tuple[float, int, float | None, float, int]] = field(
        default_factory=lambda: deque(maxlen=HISTORY)
    )  # (unix s, step, loss, tokens/s, bytes per step)
    messages: int = 0
    rejected: int = 0
    last_rejection: str = ""

    # ---- input -------------------------------------------------------------------------------------

    def ingest(self, topic: str, payload: bytes, now: float) -> bool:
        """Take one MQTT message if it verifies; False (and counted) if not."""
        try:
            message = open_message(topic, payload, self.swarm_id, self.coordinator_key)
        except RecordError as e:
            self.rejected += 1
            self.last_rejection = str(e)[:200]
            logger.debug("telemetry message refused: %s", e)
            return False
        if "/peer/" in topic and not self._may_show(message.peer):
            self.rejected += 1
            self.last_rejection = f"{message.peer}: not a member of the swarm"
            return False
        self.apply(message, now)
        return True

    def apply(self, message: object, now: float) -> None:
        """Take a message already trusted (verified, or made by this process)."""
        self.messages += 1
        if isinstance(message, CoordinatorStatus):
            self._coordinator_status(message, now)
        elif isinstance(message, CoordinatorLinks):
            self.links = message
        elif isinstance(message, Event):
            if message not in self.events:  # the coordinator also hears its own events back from MQTT
                self.events.append(message)
        elif isinstance(message, PeerStatus | PeerMetrics):
            entry = self.peers.get(message.peer)
            if entry is None:
                if len(self.peers) >= MAX_PEERS:
                    oldest = min(self.peers, key=lambda p: self.peers[p].heard)
                    del self.peers[oldest]
                entry = self.peers[message.peer] = PeerEntry()
            if isinstance(message, PeerStatus):
                if entry.status is None or message.at >= entry.status.at:
                    entry.status = message
            elif entry.metrics is None or message.at >= entry.metrics.at:
                entry.metrics = message
            entry.heard = max(entry.heard, message.at)

    def _coordinator_status(self, status: CoordinatorStatus, now: float) -> None:
        if self.coordinator is not None and status.at < self.coordinator.at:
            return  # an older retained copy
        self.coordinator = status
        last = self.series[-1] if self.series else None
        if last is None or status.step != last[1] or now - last[0] >= 10.0:
            point = (status.at, status.step, status.loss, status.tokens_per_s, status.bytes_per_step)
            self.series.append(point)
        if status.members:  # forget peers the coordinator no longer vouches for
            allowed = self._allowed()
            for peer in [p for p in self.peers if p not in allowed]:
                del self.peers[peer]

    def _allowed(self) -> set[str]:
        c = self.coordinator
        if c is None:
            return set()
        return set(c.members) | {p for st in c.stages for p in st.peers} | set(c.spares)

    def _may_show(self, peer: str) -> bool:
        if self.coordinator is None or not self.coordinator.members:
            return True
        return peer in self._allowed()

    # ---- output ------------------------------------------------------------------------------------

    def peer_state(self, peer: str, now: float) -> str:
        entry = self.peers.get(peer)
        if entry is None or entry.status is None:
            return "unknown"
        state = entry.status.state
        if state != "offline" and now - entry.heard > SILENT_S:
            return "stale"
        return state

    def snapshot(self, now: float) -> dict[str, Any]:
        """Everything the dashboard draws, as JSON-able data (``/api/v1/state``)."""
        c = self.coordinator
        peers = [self._peer_row(p, e, now) for p, e in sorted(self.peers.items())]
        counts: dict[str, int] = {}
        for row in peers:
            counts[row["state"]] = counts.get(row["state"], 0) + 1
        return {
            "swarm": self.swarm_id,
            "at": now,
            "job": None if c is None else self._job(c),
            "plan": None if c is None or c.epoch is None else self._plan(c, now),
            "jobs": [] if c is None else [j.model_dump() for j in c.jobs],
            "lease": None
            if c is None or c.lease_round is None
            else {"round": c.lease_round, "end": c.lease_end},
            "peers": peers,
            "counts": counts,
            "links": [] if self.links is None else [link.model_dump() for link in self.links.links],
            "series": {
                "t": [p[0] for p in self.series],
                "step": [p[1] for p in self.series],
                "loss": [p[2] for p in self.series],
                "tokens_per_s": [p[3] for p in self.series],
                "bytes_per_step": [p[4] for p in self.series],
            },
            "events": [
                {"at": e.at, "peer": e.peer, "kind": e.kind, "detail": e.detail, "data": e.data}
                for e in reversed(self.events)
            ],
            "telemetry": {"messages": self.messages, "rejected": self.rejected, "why": self.last_rejection},
        }

    @staticmethod
    def _job(c: CoordinatorStatus) -> dict[str, Any]:
        return {
            "name": c.job,
            "state": c.state,
            "step": c.step,
            "steps": c.steps,
            "epoch": c.epoch,
            "loss": c.loss,
            "tokens_per_s": c.tokens_per_s,
            "eta_s": c.eta_s,
            "reason": c.reason,
        }

    def _plan(self, c: CoordinatorStatus, now: float) -> dict[str, Any]:
        stages = []
        for j, st in enumerate(c.stages):
            replicas = []
            for p in st.peers:
                entry = self.peers.get(p)
                m = entry.metrics if entry is not None else None
                busy = m.timing.compute / m.timing.total if m is not None and m.timing.total > 0 else None
                member = c.members.get(p)
                replicas.append(
                    {
                        "peer": p,
                        "state": self.peer_state(p, now),
                        "device": member.device if member is not None else "",
                        "utilisation": busy,
                    }
                )
            layers = f"{st.first_layer}-{st.last_layer - 1}"
            stages.append({"stage": j, "layers": layers, "replicas": replicas})
        spares = [{"peer": p, "reason": why} for p, why in sorted(c.spares.items())]
        return {"epoch": c.epoch, "start_step": c.start_step, "stages": stages, "spares": spares}

    def _peer_row(self, peer: str, e: PeerEntry, now: float) -> dict[str, Any]:
        s, m = e.status, e.metrics
        return {
            "id": peer,
            "state": self.peer_state(peer, now),
            "stage": s.stage if s else None,
            "replica": s.replica if s else None,
            "step": max(s.step if s else 0, m.step if m else 0),
            "device": s.device if s else "",
            "tflops": s.tflops if s else 0.0,
            "message": s.message if s else "",
            "last_abort": s.last_abort if s else "",
            "heard_s_ago": round(max(0.0, now - e.heard), 1),
            "loss": m.loss if m else None,
            "tokens_per_s": m.tokens_per_s if m else 0.0,
            "timing": m.timing.model_dump() if m else None,
            "bytes_sent": m.bytes_sent if m else 0,
            "bytes_received": m.bytes_received if m else 0,
            "bytes_sent_per_step": m.bytes_sent_per_step if m else 0,
            "codec_ratio": dict(m.codec_ratio) if m else {},
            "memory_bytes": m.memory_bytes if m else 0,
            "steps_contributed": m.steps_contributed if m else 0,
            "tokens_contributed": m.tokens_contributed if m else 0,
            "flops_contributed": m.flops_contributed if m else 0.0,
            "links": {p: link.model_dump() for p, link in m.links.items()} if m else {},
            "bytes_per_link": dict(m.bytes_per_link) if m else {},
        }
