"""Publishing telemetry without ever holding training up.

Callers hand messages to ``send`` (never blocks, never raises): they go into a bounded queue that drops
its oldest message when full, so a dead or slow broker costs at most ``queue_size`` messages of memory
and never a step. One task (``run``) connects, sends the retained messages again after every (re)connect
(a broker that restarted forgot them), drains the queue, and reconnects with exponential backoff when
the broker goes away. Each publish is bounded by ``publish_timeout_s``; a message that fails is dropped
(the next metrics message supersedes it; retained ones are re-sent on reconnect).

The last will is a signed message made at connect time (a peer's "offline" status): the broker
publishes it when the connection dies without a goodbye (SIGKILL, a crash, a pulled cable, after
1.5 keepalives); a graceful ``close`` publishes the goodbye itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import aiomqtt

from potluck.telemetry.config import MqttTarget, PublisherConfig
from potluck.telemetry.connection import ERRORS, client, keep_connected

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outgoing:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False


class Publisher:
    def __init__(
        self,
        target: MqttTarget,
        client_id: str,
        will: Callable[[], Outgoing] | None = None,
        cfg: PublisherConfig | None = None,
    ) -> None:
        """``will``: makes the last-will message at each connect (signed then, so its time is fresh)."""
        self.target, self.client_id, self.will, self.cfg = target, client_id, will, cfg or PublisherConfig()
        self._queue: deque[Outgoing] = deque(maxlen=self.cfg.queue_size)
        self._retained: dict[str, Outgoing] = {}  # topic -> newest retained message
        self._wake = asyncio.Event()
        self._client: aiomqtt.Client | None = None
        self.connected = False
        self.sent = 0
        self.dropped = 0  # messages lost to a full queue or a failed publish
        self.connects = 0

    # ---- the caller's side: never blocks ----------------------------------------------------------

    def send(self, message: Outgoing) -> None:
        if message.retain:
            self._retained[message.topic] = message
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1  # deque(maxlen) drops the oldest on append
        self._queue.append(message)
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._queue)

    # ---- the task --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, send, reconnect with backoff; runs until cancelled."""
        await keep_connected(self._session, self.target, self.cfg, lambda: self.connects, "telemetry")

    async def _session(self) -> None:
        will = None
        if self.will is not None:
            w = self.will()
            will = aiomqtt.Will(w.topic, w.payload, qos=1, retain=True)
        try:
            async with client(self.target, self.client_id, self.cfg, will) as mqtt:
                await self._serve(mqtt)
        finally:
            self.connected, self._client = False, None

    async def _serve(self, mqtt: aiomqtt.Client) -> None:
        self._client, self.connected = mqtt, True
        self.connects += 1
        logger.info("telemetry: connected to %s", self.target.url(False))
        for message in list(self._retained.values()):  # a restarted broker forgot them
            await self._publish(mqtt, message)
        while True:
            while self._queue:
                message = self._queue.popleft()
                if message.retain and self._retained.get(message.topic) is not message:
                    continue  # superseded by a newer retained message, already sent or queued
                await self._publish(mqtt, message)
            self._wake.clear()
            await self._wake.wait()

    async def _publish(self, mqtt: aiomqtt.Client, m: Outgoing) -> None:
        try:
            await asyncio.wait_for(
                mqtt.publish(m.topic, m.payload, qos=m.qos, retain=m.retain), self.cfg.publish_timeout_s
            )
        except TimeoutError:
            self.dropped += 1
            raise
        self.sent += 1

    async def once(self, message: Outgoing, timeout_s: float = 3.0) -> bool:
        """Publish ``message`` over a connection of its own (the run task may be gone: a goodbye after
        the daemon's tasks ended); True if the broker took it within ``timeout_s``."""

        async def go() -> None:
            async with client(self.target, self.client_id, self.cfg, timeout_s=timeout_s) as mqtt:
                await mqtt.publish(message.topic, message.payload, qos=1, retain=message.retain)

        try:
            await asyncio.wait_for(go(), timeout_s)
        except ERRORS as e:
            logger.info("telemetry: %s not sent: %s", message.topic, e)
            return False
        return True
