"""Errors of state transfer: a whole fetch that found no usable state, one holder's failed transfer."""

from __future__ import annotations

from collections.abc import Iterable

from potluck.errors import PotluckError


class StateError(PotluckError):
    """A stage's state could not be fetched: no source answered, or none answered with valid state.

    ``unreachable``: holders that no stream could be opened to (a dead peer whose heartbeat has not
    expired yet); the fetching peer names them as suspects, so the coordinator stops counting on them.
    ``settling``: some holder was reachable and may still come to hold the state (it answered that it has
    none yet, or its transfer failed), so asking again can succeed though others are unreachable."""

    def __init__(self, message: str, unreachable: Iterable[str] = (), settling: bool = False) -> None:
        super().__init__(message)
        self.unreachable = frozenset(unreachable)
        self.settling = settling


class TransferError(StateError):
    """One holder's transfer failed: bad signature, manifest or chunk hash, a timeout or a lost stream."""
