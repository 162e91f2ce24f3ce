import asyncio
import struct

import pytest

from potluck.protocol.errors import WireError
from potluck.protocol.wire import HEADER, MAGIC, MAX_PAYLOAD, Frame, MsgType, encode_header, read_frame


def read(data: bytes, timeout: float, eof: bool = True, expect=None) -> Frame:
    """read_frame over a stream holding ``data`` (then EOF, unless ``eof`` is False: a silent peer)."""

    async def go() -> Frame:
        r = asyncio.StreamReader()
        r.feed_data(data)
        if eof:
            r.feed_eof()
        return await read_frame(r, timeout, expect=expect)

    return asyncio.run(go())


def test_roundtrip_frame():
    data = encode_header(MsgType.PING, 3) + b"abc"
    frame = read(data, 1.0)
    assert frame == Frame(MsgType.PING, b"abc")


def test_oversize_rejected_from_header_alone():
    # the header declares 1 GiB of TENSOR data; nothing follows, nothing may be allocated or awaited
    header = HEADER.pack(MAGIC, 1, int(MsgType.TENSOR), 0, MAX_PAYLOAD[MsgType.TENSOR] + 1)
    with pytest.raises(WireError, match="limit"):
        read(header, 5.0, eof=False)
    with pytest.raises(WireError, match="exceeds"):
        encode_header(MsgType.PING, 2048)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (HEADER.pack(b"HTTP", 1, 1, 0, 0), "bad frame magic"),
        (HEADER.pack(MAGIC, 9, 1, 0, 0), "unsupported wire version"),
        (HEADER.pack(MAGIC, 1, 99, 0, 0), "unknown message type"),
        (encode_header(MsgType.PING, 10) + b"abc", "closed the stream mid-frame"),
        (encode_header(MsgType.BULK, 0), "expected"),
        (encode_header(MsgType.ERROR, 4) + b"boom", "peer reported an error: boom"),
    ],
)
def test_bad_frames(data, message):
    with pytest.raises(WireError, match=message):
        read(data, 1.0, expect={MsgType.PING})


def test_silent_peer_times_out():
    with pytest.raises(WireError, match="no frame from peer within"):
        read(b"", 0.05, eof=False)
    partial = encode_header(MsgType.BULK_DONE, 8) + struct.pack("<I", 1)
    with pytest.raises(WireError, match="no frame from peer within"):
        read(partial, 0.05, eof=False)


def test_a_reset_stream_is_a_wire_error_like_a_closed_one():
    """A peer that resets its stream (a refused probe, a crashed peer) must not escape as a bare OSError:
    callers catch WireError per peer and would otherwise lose the rest of their round."""

    async def go() -> Frame:
        r = asyncio.StreamReader()
        r.feed_data(encode_header(MsgType.PING, 10) + b"abc")
        r.set_exception(ConnectionResetError(104, "Connection reset by peer"))
        return await read_frame(r, 1.0)

    with pytest.raises(WireError, match="closed the stream"):
        asyncio.run(go())
