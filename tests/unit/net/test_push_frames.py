"""The push frame (``net/push.py``): what decodes, and what is refused before use."""

from __future__ import annotations

import msgpack
import pytest

from potluck.net.push import decode_push, encode_push
from potluck.protocol.errors import RecordError


def test_a_payload_round_trips():
    assert decode_push(encode_push("plan", 1234.5, b"\x01\x02")) == ("plan", 1234.5, b"\x01\x02")


@pytest.mark.parametrize(
    "fields",
    [
        ["plan", 1.0],
        ["plan", "soon", b"x"],
        [b"plan", 1.0, b"x"],
        ["plan", 1.0, "x"],
        ["plan", True, b"x"],
        {"a": 1},
    ],
)
def test_anything_but_name_expiry_and_bytes_is_refused(fields):
    with pytest.raises(RecordError, match="malformed"):
        decode_push(msgpack.packb(fields, use_bin_type=True))


def test_garbage_is_refused():
    with pytest.raises(RecordError, match="malformed"):
        decode_push(b"\xc1\xff\x00")
