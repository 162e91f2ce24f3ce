"""Errors of the compression package. Each carries a message a user can act on."""

from __future__ import annotations

from potluck.errors import PotluckError


class CompressionError(PotluckError):
    """Base class for everything the compression package rejects."""


class SpecError(CompressionError, ValueError):
    """A codec spec string is malformed: unknown stage, bad parameter, or stages in an invalid order."""


class EncodeError(CompressionError, ValueError):
    """A tensor cannot be encoded with this codec (wrong dtype, too large, missing state or key)."""


class NonFiniteError(EncodeError):
    """The tensor holds NaN or Inf; pass ``nonfinite="zero"`` to ``get_codec`` to replace them by 0."""


class DecodeError(CompressionError, ValueError):
    """A payload is truncated, corrupted (checksum), of an unknown version, or declares an absurd shape."""
