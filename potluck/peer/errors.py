"""Errors of the peer package."""

from potluck.protocol.errors import CheckpointError as CheckpointError  # raised by checkpoint code here too


class PeerError(Exception):
    """Base class for failures inside the peer daemon."""


class CollectiveError(PeerError):
    """An all-reduce could not complete: a peer was missing, slow past its deadline, or sent bad data."""


class DataError(PeerError, ValueError):
    """The dataset is missing, empty, or malformed; the message names the file."""


class PipelineError(PeerError):
    """A pipeline neighbour did not deliver in time, or sent something undecodable."""


class StepAborted(PeerError):
    """The step was not committed (a peer failed or disagreed); no replica applied it."""
