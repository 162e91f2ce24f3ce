"""Errors of the protocol package. Each carries a message a user can act on."""

from __future__ import annotations

from potluck.errors import PotluckError


class ProtocolError(PotluckError):
    """Base class for everything the protocol package rejects."""


class IdentityError(ProtocolError):
    """A key file is missing, unreadable, malformed or too permissive."""


class RecordError(ProtocolError):
    """A record or envelope is malformed, oversized, unsigned, forged, stale or of another swarm."""


class InviteError(ProtocolError):
    """An invite string is garbage, truncated or of an unknown version."""


class JobSpecError(ProtocolError):
    """A job file is unreadable or a field is invalid; the message names the field."""


class BootstrapError(ProtocolError):
    """No bootstrap peer could be reached, or the p2p daemon did not start; the message says what to try."""


class WireError(ProtocolError):
    """A stream frame was malformed, oversized, unexpected, or did not arrive in time."""


class DialError(WireError):
    """No stream could be opened to a peer: it is down or unreachable (not a peer that misbehaved)."""


class CheckpointError(ProtocolError):
    """A checkpoint on disk is missing, incomplete, or damaged; the message names the file and the fault."""


class AdmissionError(RecordError):
    """A join token or admission is missing, malformed, forged, expired, for another peer, or banned."""


class FaultError(ProtocolError):
    """``POTLUCK_FAULTS`` holds something that is not a fault plan (``net/faults.py``)."""
