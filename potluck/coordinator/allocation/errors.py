"""Errors of the allocation package. Each carries a message a user can act on."""

from __future__ import annotations

from potluck.coordinator.errors import CoordinatorError


class AllocationError(CoordinatorError):
    """The allocator was given something it cannot allocate over (shapes, unknown names, bad values)."""


class SolverError(AllocationError):
    """The linear program could not be solved (HiGHS reported a status other than optimal)."""
