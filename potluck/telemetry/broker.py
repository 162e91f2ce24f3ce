"""The embedded broker: amqtt in the coordinator's process, so a swarm needs no broker of its own.

It listens on loopback by default (``127.0.0.1``, a free port). Volunteers on other machines reach it
only when the owner binds it to an address they can reach (``--mqtt-bind 0.0.0.0:1883``); for a public
swarm an external broker with passwords and TLS (mosquitto, ``--mqtt-url``) is the better choice.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from amqtt.broker import Broker

from potluck.telemetry.config import MqttTarget
from potluck.telemetry.errors import TelemetryError

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


class EmbeddedBroker:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self._broker: Any = None

    async def start(self) -> MqttTarget:
        """Start listening; returns where clients connect (the chosen port when ``port`` was 0)."""
        listener = {"type": "tcp", "bind": f"{self.host}:{self.port}", "max_connections": 4096}
        config = {
            "listeners": {"default": listener},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }
        for name in ("amqtt", "transitions"):  # each connect and packet at INFO: far too chatty for us
            logging.getLogger(name).setLevel(logging.ERROR)
        broker = Broker(config)
        try:
            await asyncio.wait_for(broker.start(), START_TIMEOUT_S)
        except Exception as e:  # amqtt wraps bind errors in its own types
            where = f"{self.host}:{self.port}"
            raise TelemetryError(f"the embedded MQTT broker could not listen on {where}: {e}") from e
        self._broker = broker
        self.port = self._bound_port(broker) or self.port
        logger.info("embedded MQTT broker listening on %s:%d", self.host, self.port)
        client_host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return MqttTarget(client_host, self.port)

    @staticmethod
    def _bound_port(broker: Any) -> int | None:
        """The port the listener got (amqtt keeps its asyncio server on ``_servers``)."""
        try:
            server = broker._servers["default"].instance
            return int(server.sockets[0].getsockname()[1])
        except (AttributeError, KeyError, IndexError, TypeError):
            return None

    async def stop(self) -> None:
        if self._broker is None:
            return
        broker, self._broker = self._broker, None
        try:
            await asyncio.wait_for(broker.shutdown(), STOP_TIMEOUT_S)
        except Exception as e:  # shutdown is best effort: the process is ending anyway
            logger.info("embedded broker shutdown: %s", e)
