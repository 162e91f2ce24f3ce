"""Tensor codecs for activations and gradients on slow links; no networking inside.

    codec = get_codec("topk:density=0.01|int4:block=64|zstd")
    data = codec.encode(grad, key=(round, tensor_id, part), state=ErrorFeedback())
    codec.decode_into(data, accumulator)          # or decode(data) for a fresh tensor

Every payload is self-describing (docs/wire-format.md): ``decode(data)`` needs no codec.
"""

from __future__ import annotations

from potluck.compression.base import Codec, all_finite
from potluck.compression.chooser import Choice, choose
from potluck.compression.delta import ActivationCache, DeltaCoder
from potluck.compression.errors import CompressionError, DecodeError, EncodeError, NonFiniteError, SpecError
from potluck.compression.feedback import ErrorFeedback
from potluck.compression.registry import STAGES, decode, decode_into, get_codec

__all__ = [
    "STAGES",
    "ActivationCache",
    "Choice",
    "Codec",
    "CompressionError",
    "DecodeError",
    "DeltaCoder",
    "EncodeError",
    "ErrorFeedback",
    "NonFiniteError",
    "SpecError",
    "all_finite",
    "choose",
    "decode",
    "decode_into",
    "get_codec",
]
