"""Errors of the telemetry package."""

from __future__ import annotations

from potluck.errors import PotluckError


class TelemetryError(PotluckError):
    """A broker URL is malformed, the embedded broker did not start, or a web server could not bind."""
