"""Errors of state transfer: a whole fetch that found no usable state, one holder's failed transfer."""

from __future__ import annotations

from potluck.errors import PotluckError


class StateError(PotluckError):
    """A stage's state could not be fetched: no source answered, or none answered with valid state."""


class TransferError(StateError):
    """One holder's transfer failed: bad signature, manifest or chunk hash, a timeout or a lost stream."""
