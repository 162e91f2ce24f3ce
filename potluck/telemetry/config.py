"""Where telemetry goes: a broker URL, parsed once.

``mqtt://[user[:password]@]host[:port]`` (port 1883) or ``mqtts://...`` (TLS, port 8883). The URL travels
in the invite, so every peer of a swarm publishes to the broker its owner chose; a peer may override it
(``--mqtt-url``) or turn telemetry off (``--no-telemetry``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit

from potluck.telemetry.errors import TelemetryError

MAX_URL_CHARS = 512


@dataclass(frozen=True)
class MqttTarget:
    host: str
    port: int
    username: str | None = None
    password: str | None = None
    tls: bool = False
    ca_file: str | None = None  # TLS: trust this CA bundle instead of the system's
    insecure: bool = False  # TLS: do not check the broker's certificate (testing only)

    @classmethod
    def parse(cls, url: str, ca_file: str | None = None, insecure: bool = False) -> MqttTarget:
        if len(url) > MAX_URL_CHARS:
            raise TelemetryError(f"broker URL is {len(url)} characters (limit {MAX_URL_CHARS})")
        try:
            parts = urlsplit(url.strip())
            port = parts.port
        except ValueError as e:
            raise TelemetryError(f"broker URL {url!r}: {e}") from None
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise TelemetryError(f"broker URL {url!r}: use mqtt://host:port or mqtts://host:port")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise TelemetryError(f"broker URL {url!r}: no path or query after host:port")
        tls = parts.scheme == "mqtts"
        return cls(
            host=parts.hostname,
            port=port or (8883 if tls else 1883),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            tls=tls,
            ca_file=ca_file,
            insecure=insecure,
        )

    def url(self, with_password: bool = True) -> str:
        """The URL again (for the invite); ``with_password=False`` for logs and screens."""
        cred = ""
        if self.username:
            cred = quote(self.username, safe="")
            if self.password:
                cred += ":" + (quote(self.password, safe="") if with_password else "***")
            cred += "@"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'mqtts' if self.tls else 'mqtt'}://{cred}{host}:{self.port}"

    def tls_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


@dataclass(frozen=True)
class PublisherConfig:
    queue_size: int = 256  # messages waiting for the broker; beyond it the oldest are dropped
    keepalive_s: int = 10  # the broker declares us dead (and sends the will) after 1.5 of these
    connect_timeout_s: float = 10.0
    publish_timeout_s: float = 5.0
    first_backoff_s: float = 1.0
    max_backoff_s: float = 30.0


@dataclass(frozen=True)
class TelemetryConfig:
    """A peer's telemetry: where to (None: no MQTT; the status line and /metrics still work), how often."""

    target: MqttTarget | None = None
    interval_s: float = 5.0  # metrics every this many seconds
    status_every_s: float = 30.0  # the retained status is refreshed at least this often
    publisher: PublisherConfig = field(default_factory=PublisherConfig)
