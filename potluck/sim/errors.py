"""Errors of the simulator. Each carries a message a user can act on."""

from __future__ import annotations

from potluck.errors import PotluckError


class SimError(PotluckError):
    """A simulation was given inputs it cannot run (bad sizes, an unknown policy, a malformed trace)."""
