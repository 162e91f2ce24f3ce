"""Errors of the peer package: failures of the networked step and of the daemon."""

from __future__ import annotations

from potluck.compression import DecodeError
from potluck.errors import PotluckError


class PeerError(PotluckError):
    """Base class for failures inside the peer daemon."""


class CollectiveError(PeerError):
    """An all-reduce could not complete: a peer was missing, slow past its deadline, or sent bad data."""


class ContributionError(CollectiveError):
    """A replica's contribution to an all-reduce was refused (NaN or Inf): the fault is that peer's."""

    def __init__(self, peer: str, message: str) -> None:
        super().__init__(message)
        self.peer = peer


class OuterDecodeError(DecodeError, PeerError):
    """A replica's coded pseudo-gradient cannot be decoded (DiLoCo's coded outer sync); ``who``: its place
    in the contributions, which the caller maps to the peer."""

    def __init__(self, who: int, message: str) -> None:
        super().__init__(message)
        self.who = who


class LateError(CollectiveError):
    """This peer's contribution missed the deadline: it was left out of the round."""


class StragglerError(CollectiveError):
    """A replica missed its stage's all-reduce deadline too many times in a row (``sync.max_misses``)."""


class PipelineError(PeerError):
    """A pipeline neighbour did not deliver in time, or sent something undecodable."""


class StartError(PipelineError):
    """A plan's peers did not all take their starting state in time: its first step cannot run."""


class StepAborted(PeerError):
    """The step was not committed (a peer failed or disagreed); no replica applied it."""


class NeighbourError(PipelineError):
    """A pipeline neighbour sent something this peer refuses (undecodable, wrong shape, NaN or Inf): the
    fault is that peer's, and the failure report names it."""

    def __init__(self, peer: str, message: str) -> None:
        super().__init__(message)
        self.peer = peer


class SealError(NeighbourError):
    """A message's seal (its sender's signature over its step or batch, ``peer/seal``) is missing or wrong."""


class ColocationRefused(PeerError):
    """A second wave on this device was refused: staggered or not, the two waves' combined activation
    peak would not fit the memory budget (``peer/train/ticktock.py``)."""
