"""Reading a swarm's telemetry from its broker into a ``SwarmView`` (the dashboard, ``potluck monitor``).

Subscribes to ``potluck/<swarm>/#`` and hands every message to ``SwarmView.ingest``, which verifies it;
reconnects with backoff when the broker goes away. Retained messages arrive first after each
(re)subscription, so a monitor started late still sees every peer's status and the plan at once.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from potluck.protocol.telemetry import swarm_filter
from potluck.telemetry.aggregate import SwarmView
from potluck.telemetry.config import MqttTarget, PublisherConfig
from potluck.telemetry.connection import client, keep_connected

logger = logging.getLogger(__name__)


class Subscriber:
    def __init__(self, target: MqttTarget, view: SwarmView, cfg: PublisherConfig | None = None) -> None:
        self.target, self.view, self.cfg = target, view, cfg or PublisherConfig()
        self.connected = asyncio.Event()
        self.client_id = f"potluck-view-{secrets.token_hex(4)}"
        self.sessions = 0  # sessions that connected

    async def run(self) -> None:
        """Until cancelled."""
        await keep_connected(self._session, self.target, self.cfg, lambda: self.sessions, "telemetry reader")

    async def _session(self) -> None:
        try:
            async with client(self.target, self.client_id, self.cfg) as mqtt:
                await mqtt.subscribe(swarm_filter(self.view.swarm_id), qos=1)
                self.connected.set()
                self.sessions += 1
                logger.info("telemetry: reading swarm %s from %s", self.view.swarm_id, self.target.url(False))
                async for message in mqtt.messages:
                    payload = message.payload
                    if isinstance(payload, bytes | bytearray):
                        self.view.ingest(str(message.topic), bytes(payload), time.time())
        finally:
            self.connected.clear()
