"""Errors of the coordinator package. Each carries a message a user can act on."""

from __future__ import annotations

from potluck.errors import PotluckError


class CoordinatorError(PotluckError):
    """Base class for everything the coordinator rejects."""


class ScenarioError(CoordinatorError):
    """A scenario file is missing, unreadable or malformed; the message names the field."""


class NetModelError(CoordinatorError):
    """Link reports are inconsistent (unknown peer, non-positive bandwidth, wrong matrix shape)."""


class PlanningError(CoordinatorError):
    """The planner was asked something it cannot answer (no feasible shape, bad configuration)."""


class PackingError(CoordinatorError):
    """The packer cannot plan for this group: bad capacities, fewer than 2 peers, or no spanning tree."""
