"""Errors of the peer package."""


class PeerError(Exception):
    """Base class for failures inside the peer daemon."""


class CollectiveError(PeerError):
    """An all-reduce could not complete: a peer was missing, slow past its deadline, or sent bad data."""


class DataError(PeerError, ValueError):
    """The dataset is missing, empty, or malformed; the message names the file."""
