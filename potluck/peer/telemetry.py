"""A peer's telemetry: its state, numbers and events to MQTT, and the status line its volunteer reads.

``PeerTelemetry.state`` answers "is my node contributing?" from what the daemon and the worker know
(``Activity``): joining, syncing state, contributing, spare, stale, unreachable, leaving. ``run`` publishes
a retained status whenever the answer changes (and every ``status_every_s``), metrics every
``interval_s``, and events as they happen, all through a ``Publisher`` that never blocks the peer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil
import torch

from potluck.peer.activity import Activity, EventData
from potluck.protocol.identity import Identity
from potluck.protocol.records import Hardware, LinkSample
from potluck.protocol.telemetry import (
    MAX_LINKS,
    VERSION,
    Event,
    LinkRate,
    PeerMetrics,
    PeerState,
    PeerStatus,
    StepTimes,
    peer_topic,
    seal_message,
)
from potluck.telemetry.config import TelemetryConfig
from potluck.telemetry.prometheus import peer_metrics_text
from potluck.telemetry.publisher import Outgoing, Publisher

if TYPE_CHECKING:
    from potluck.peer.worker import PlanWorker

logger = logging.getLogger(__name__)

STALE_AFTER_S = 30.0  # placed, but no committed step for this long: "stale"


@dataclass(frozen=True)
class Snapshot:
    """What the status line and ``/metrics`` show: the state and the numbers behind it."""

    status: PeerStatus
    metrics: PeerMetrics


class PeerTelemetry:
    def __init__(
        self,
        identity: Identity,
        swarm_id: str,
        cfg: TelemetryConfig,
        hardware: Callable[[], Hardware | None],
        worker: Callable[[], PlanWorker | None],
        links: Callable[[], dict[str, LinkSample]],
        leaving: Callable[[], bool],
        alone: Callable[[], bool],
    ) -> None:
        self.identity, self.swarm_id, self.cfg = identity, swarm_id, cfg
        self._hardware, self._worker, self._links = hardware, worker, links
        self._leaving, self._alone = leaving, alone
        self.joined_at = time.time()
        self.publisher: Publisher | None = None
        if cfg.target is not None:
            client_id = f"potluck-{identity.peer_id[-16:]}"
            self.publisher = Publisher(cfg.target, client_id, self._will, cfg.publisher)
        self._process = psutil.Process()
        self.on_change: Callable[[Snapshot], None] | None = None  # the CLI's status line

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def activity(self) -> Activity | None:
        worker = self._worker()
        return worker.activity if worker is not None else None

    # ---- what the peer is doing ---------------------------------------------------------------------

    def state(self, now_mono: float) -> PeerState:
        if self._leaving():
            return "leaving"
        if self._alone():
            return "unreachable"
        act = self.activity()
        if self._hardware() is None or act is None or act.phase == "idle":
            return "joining"
        if act.phase in ("spare", "done"):
            return "spare"
        if act.phase == "syncing":
            return "syncing"
        if act.phase == "training" and now_mono - act.last_step_at <= STALE_AFTER_S:
            return "contributing"
        return "stale"  # placed, but its steps do not commit (failed, or waiting on the swarm)

    def snapshot(self, now: float | None = None, now_mono: float | None = None) -> Snapshot:
        now = time.time() if now is None else now
        now_mono = time.monotonic() if now_mono is None else now_mono
        state = self.state(now_mono)
        act = self.activity() or Activity()
        hw = self._hardware()
        worker = self._worker()
        report = worker.last_report if worker is not None else None
        status = PeerStatus(
            v=VERSION,
            peer=self.peer_id,
            at=now,
            state=state,
            job=act.job,
            epoch=act.epoch,
            stage=act.stage,
            replica=act.replica,
            step=act.step,
            device=hw.label[:500] if hw is not None else "",
            tflops=hw.tflops_fp32 if hw is not None else 0.0,
            joined_at=self.joined_at,
            message=act.why[:500],
            last_abort=act.last_abort,
        )
        links = {
            peer: LinkRate(mb_s=s.bandwidth_gbps * 125.0, rtt_ms=s.rtt_ms)
            for peer, s in list(self._links().items())[:64]
        }
        ratios: dict[str, float] = {}
        if act.activation_ratio > 0:
            ratios["activations"] = act.activation_ratio
        if act.gradient_ratio > 0:
            ratios["gradients"] = act.gradient_ratio
        box = worker.box if worker is not None else None
        metrics = PeerMetrics(
            v=VERSION,
            peer=self.peer_id,
            at=now,
            state=state,
            epoch=act.epoch,
            stage=act.stage,
            replica=act.replica,
            step=act.step,
            loss=report.loss if report is not None and abs(report.loss) < 1e6 else None,
            tokens_per_s=worker.tokens_per_s if worker is not None else 0.0,
            timing=StepTimes(**report.timing.model_dump()) if report is not None else StepTimes(),
            bytes_sent_per_step=report.bytes_sent if report is not None else 0,
            bytes_sent=box.bytes_sent if box is not None else 0,
            bytes_received=box.bytes_received if box is not None else 0,
            links=links,
            bytes_per_link=_top(box.sent_to, MAX_LINKS) if box is not None else {},
            codec_ratio=ratios,  # type: ignore[arg-type]
            memory_bytes=self._rss(),
            device_memory_bytes=_device_memory(),
            steps_contributed=act.steps_contributed,
            tokens_contributed=act.tokens_contributed,
            flops_contributed=act.flops_contributed,
        )
        return Snapshot(status, metrics)

    def _rss(self) -> int:
        try:
            return int(self._process.memory_info().rss)
        except psutil.Error:
            return 0

    # ---- publishing ----------------------------------------------------------------------------------

    def event(self, kind: str, detail: str, data: EventData) -> None:
        """Queue an event (the worker's ``Activity.on_event``); never blocks."""
        if self.publisher is None:
            return
        message = Event(
            v=VERSION,
            peer=self.peer_id,
            at=time.time(),
            kind=kind,  # type: ignore[arg-type]
            detail=detail[:500],
            data=data,
        )
        self.publisher.send(Outgoing(self._topic("events"), seal_message(self.identity, message), qos=1))

    def _will(self) -> Outgoing:
        """The last will: this peer's status, "offline", signed at (re)connect time."""
        offline = self.snapshot().status.model_copy(update={"state": "offline", "message": "connection lost"})
        return self._status(offline)

    def _status(self, status: PeerStatus) -> Outgoing:
        return Outgoing(self._topic("status"), seal_message(self.identity, status), qos=1, retain=True)

    def _topic(self, kind: str) -> str:
        return peer_topic(self.swarm_id, self.peer_id, kind)  # type: ignore[arg-type]

    async def run(self) -> None:
        """Publish until cancelled; tell ``on_change`` whenever the state or placement changes."""
        pub = self.publisher
        task = asyncio.create_task(pub.run(), name="mqtt-publisher") if pub is not None else None
        shown: tuple[object, ...] | None = None
        last_status = last_metrics = last_line = 0.0
        try:
            while True:
                now = time.monotonic()
                snap = self.snapshot()
                s = snap.status
                key = (s.state, s.epoch, s.stage, s.replica, s.message, s.last_abort)
                changed = key != shown
                # The line at once on a change, and every status_every_s (steps, tokens) besides.
                if self.on_change is not None and (changed or now - last_line >= self.cfg.status_every_s):
                    try:
                        self.on_change(snap)
                    except Exception:  # the volunteer's status line must never stop the peer
                        logger.exception("the status line failed")
                    last_line = now
                if pub is not None:
                    if changed or now - last_status >= self.cfg.status_every_s:
                        pub.send(self._status(s))
                        last_status = now
                    if now - last_metrics >= self.cfg.interval_s:
                        payload = seal_message(self.identity, snap.metrics)
                        pub.send(Outgoing(self._topic("metrics"), payload))
                        last_metrics = now
                shown = key
                await asyncio.sleep(min(1.0, self.cfg.interval_s))
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def goodbye(self, timeout_s: float = 3.0) -> None:
        """A graceful exit: the retained status says "offline" (the will is only for deaths); bounded."""
        if self.publisher is None:
            return
        offline = self.snapshot().status.model_copy(update={"state": "offline", "message": "left"})
        await self.publisher.once(self._status(offline), timeout_s)


def _top(counts: dict[str, int], n: int) -> dict[str, int]:
    """The ``n`` largest entries (a message carries at most ``MAX_LINKS`` links)."""
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:n])


def _device_memory() -> int:
    """Accelerator memory this process holds (0 on CPU)."""
    try:
        return int(torch.cuda.memory_allocated()) if torch.cuda.is_available() else 0
    except Exception:
        return 0


def peer_metrics(snapshot: Snapshot) -> bytes:
    """This peer's Prometheus text (``--metrics-port``)."""
    return peer_metrics_text(snapshot.status, snapshot.metrics)
