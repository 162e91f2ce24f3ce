"""Errors of the class-parallel library: grouping, pruning, sub-networks, merging, coding, data."""

from __future__ import annotations

from potluck.errors import PotluckError


class ClassParallelError(PotluckError):
    """Base class for failures of class-parallel training and serving (sensAI and its coded variant)."""


class GroupingError(ClassParallelError, ValueError):
    """Classes cannot be split as asked (more groups than classes, say); the message gives both counts."""


class PruneError(ClassParallelError, ValueError):
    """A pruning request that cannot be met (a bad threshold, no data for the group)."""


class MergeError(ClassParallelError, ValueError):
    """Sub-network outputs that do not fit the grouping (wrong count or width)."""


class CodeError(ClassParallelError, ValueError):
    """An erasure code that cannot be built, or replies from which the scores cannot be decoded."""


class ImageFolderError(ClassParallelError, ValueError):
    """An image folder that cannot be read as a class-per-subdirectory data set; the message names it."""
