"""Reading a swarm's telemetry from its broker into a ``SwarmView`` (the dashboard, ``potluck monitor``).

Subscribes to ``potluck/<swarm>/#`` and hands every message to ``SwarmView.ingest``, which verifies it;
reconnects with backoff when the broker goes away. Retained messages arrive first after each
(re)subscription, so a monitor started late still sees every peer's status and the plan at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time

import aiomqtt

from potluck.protocol.telemetry import swarm_filter
from potluck.telemetry.aggregate import SwarmView
from potluck.telemetry.config import MqttTarget, PublisherConfig

logger = logging.getLogger(__name__)


class Subscriber:
    def __init__(self, target: MqttTarget, view: SwarmView, cfg: PublisherConfig | None = None) -> None:
        self.target, self.view, self.cfg = target, view, cfg or PublisherConfig()
        self.connected = asyncio.Event()
        self.client_id = f"potluck-view-{secrets.token_hex(4)}"

    async def run(self) -> None:
        """Until cancelled."""
        backoff, told = self.cfg.first_backoff_s, False
        while True:
            try:
                await self._session()
            except (aiomqtt.MqttError, OSError, TimeoutError) as e:
                (logger.debug if told else logger.warning)(
                    "telemetry broker %s unavailable (%s); retrying", self.target.url(False), e
                )
                told = True
                if self.connected.is_set():
                    backoff, told = self.cfg.first_backoff_s, False
            finally:
                self.connected.clear()
            await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
            backoff = min(self.cfg.max_backoff_s, backoff * 2)

    async def _session(self) -> None:
        t = self.target
        async with aiomqtt.Client(
            t.host,
            t.port,
            username=t.username,
            password=t.password,
            identifier=self.client_id,
            keepalive=self.cfg.keepalive_s,
            timeout=self.cfg.connect_timeout_s,
            tls_context=t.tls_context(),
        ) as client:
            await client.subscribe(swarm_filter(self.view.swarm_id), qos=1)
            self.connected.set()
            logger.info("telemetry: reading swarm %s from %s", self.view.swarm_id, t.url(False))
            async for message in client.messages:
                payload = message.payload
                if isinstance(payload, bytes | bytearray):
                    self.view.ingest(str(message.topic), bytes(payload), time.time())
