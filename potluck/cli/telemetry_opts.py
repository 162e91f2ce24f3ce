"""Telemetry options shared by ``launch`` and ``demo``: the broker (embedded or external) and the dashboard.

The embedded broker must listen before the coordinator prints its invite, which carries the broker's
URL to every peer; the dashboard starts once the service runs (it reads the service's view).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from potluck.cli.common import fail

if TYPE_CHECKING:
    from potluck.coordinator.service import CoordinatorService
    from potluck.coordinator.telemetry import CoordinatorTelemetry
    from potluck.telemetry.broker import EmbeddedBroker
    from potluck.telemetry.config import MqttTarget

logger = logging.getLogger(__name__)

MQTT_URL_HELP = (
    "External MQTT broker for telemetry, e.g. mqtts://user:pass@broker.example:8883 (default: an embedded "
    "broker in this process)."
)
MQTT_BIND_HELP = "Where the embedded broker listens, HOST:PORT (port 0: any free port)."
DASHBOARD_HELP = (
    "Where the web dashboard listens, HOST:PORT (port 0: any free port; a busy port falls back to one)."
)


def parse_bind(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise fail(f"{what} {text!r}: use HOST:PORT, e.g. 127.0.0.1:8470")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class TelemetryOptions:
    enabled: bool = True
    mqtt_url: str | None = None
    mqtt_bind: str = "127.0.0.1:0"
    dashboard_bind: str | None = "127.0.0.1:8470"
    ca_file: str | None = None
    insecure: bool = False


class TelemetryStack:
    """The broker (when embedded), then the coordinator's publisher, subscriber and dashboard."""

    def __init__(self, opts: TelemetryOptions) -> None:
        self.opts = opts
        self.broker: EmbeddedBroker | None = None
        self.target: MqttTarget | None = None
        self.telemetry: CoordinatorTelemetry | None = None
        self.dashboard_url: str | None = None

    async def open_broker(self) -> str | None:
        """Start the embedded broker or check the external URL; returns the URL for the invite."""
        from potluck.telemetry.broker import EmbeddedBroker
        from potluck.telemetry.config import MqttTarget
        from potluck.telemetry.errors import TelemetryError

        o = self.opts
        if not o.enabled:
            return None
        try:
            if o.mqtt_url:
                self.target = MqttTarget.parse(o.mqtt_url, o.ca_file, o.insecure)
            else:
                self.broker = EmbeddedBroker(*parse_bind(o.mqtt_bind, "--mqtt-bind"))
                self.target = await self.broker.start()
        except TelemetryError as e:
            raise fail(str(e)) from None
        return self.target.url()

    async def start(self, service: CoordinatorService) -> None:
        from potluck.coordinator.telemetry import CoordinatorTelemetry
        from potluck.telemetry.errors import TelemetryError

        look = service.moment
        o = self.opts
        bind = parse_bind(o.dashboard_bind, "--dashboard-bind") if o.enabled and o.dashboard_bind else None
        self.telemetry = CoordinatorTelemetry(service.identity, service.cfg.swarm_id, look, self.target, bind)
        try:
            self.dashboard_url = await self.telemetry.start()
        except TelemetryError as e:
            if bind is None or bind[1] == 0:
                raise
            logger.warning("%s; serving the dashboard on a free port instead", e)
            self.telemetry = CoordinatorTelemetry(
                service.identity, service.cfg.swarm_id, look, self.target, (bind[0], 0)
            )
            self.dashboard_url = await self.telemetry.start()

    async def stop(self) -> None:
        if self.telemetry is not None:
            await self.telemetry.stop()
        if self.broker is not None:
            await self.broker.stop()
