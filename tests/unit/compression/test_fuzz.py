"""Hypothesis fuzzing of the decoder: garbage and resealed mutations never escape as anything but
DecodeError, and a successful decode never yields more elements than the payload could justify."""

from __future__ import annotations

import struct

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from potluck.compression import DecodeError, decode, get_codec
from potluck.compression.wire import seal

SPECS = [
    "int8",
    "int4:block=32|zstd",
    "topk:density=0.1|int2",
    "randk:density=0.2|fp16",
    "bf16|zstd",
    "powersgd:rank=1|int8",
]
_SEEDS = {
    spec: get_codec(spec).encode(torch.randn(24, 20, generator=torch.Generator().manual_seed(i)), key=(1, i))
    for i, spec in enumerate(SPECS)
}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _reseal(buf: bytearray) -> bytes:
    return seal(buf)


def _decode_or_reject(data: bytes) -> None:
    try:
        out = decode(data, max_elements=1 << 20)
    except DecodeError:
        return
    assert out.numel() <= 1 << 20


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_are_rejected_cleanly(data: bytes) -> None:
    _decode_or_reject(data)


@FUZZ
@given(
    spec=st.sampled_from(SPECS),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
)
def test_resealed_mutations_are_rejected_or_decoded(spec: str, edits: list[tuple[int, int]]) -> None:
    buf = bytearray(_SEEDS[spec])
    for pos, val in edits:
        buf[pos % (len(buf) - 4)] = val
    _decode_or_reject(_reseal(buf))


@FUZZ
@given(spec=st.sampled_from(SPECS), cut=st.integers(0, 10_000), extra=st.binary(max_size=16))
def test_truncated_or_extended_payloads_are_rejected(spec: str, cut: int, extra: bytes) -> None:
    data = _SEEDS[spec]
    cut %= len(data)
    _decode_or_reject(data[:cut] + extra)


@FUZZ
@given(dims=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=4))
def test_any_declared_shape_is_checked_before_allocating(dims: list[int]) -> None:
    buf = bytearray(_SEEDS["int8"])
    ndim = buf[6]
    body = buf[24 + 8 * ndim :]
    head = bytearray(buf[:24])
    head[6] = len(dims)
    _decode_or_reject(_reseal(head + struct.pack(f"<{len(dims)}Q", *dims) + body))
