"""Errors of the model package: what is trained, on one machine."""

from __future__ import annotations

from potluck.errors import PotluckError


class ModelError(PotluckError):
    """Base class for failures of the single-machine recipe (model, data, optimizer, checkpoints)."""


class DataError(ModelError, ValueError):
    """The dataset is missing, empty, or malformed; the message names the file."""


class DeviceError(ModelError, ValueError):
    """A device or precision that cannot be used here (``--device cuda`` without a GPU, say)."""


class HubError(ModelError, ValueError):
    """A Hugging Face model directory potluck cannot use (its type, a missing or mismatched tensor, a
    field the job contradicts); the message names the file and what to change."""
