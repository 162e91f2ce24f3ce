"""Framing of binary messages on potluck's P2P streams.

A frame is a 12-byte little-endian header ``magic "PLW1" | version u8 | type u8 | flags u16 |
length u32`` followed by ``length`` payload bytes. The reader checks the header and the length against
the limit for that message type BEFORE reading (allocating) the payload, and every read has a timeout,
so a slow, dead or hostile peer costs at most one bounded wait and no memory.
"""

from __future__ import annotations

import asyncio
import enum
import struct
from dataclasses import dataclass

from potluck.protocol.errors import WireError

MAGIC = b"PLW1"
VERSION = 1
HEADER = struct.Struct("<4sBBHI")
HEADER_BYTES = HEADER.size  # 12
MAX_STATE_CHUNK_BYTES = 4 << 20  # largest raw chunk of a state transfer a manifest may declare, bytes
STATE_ZSTD = 1  # frame flag of STATE_CHUNK: the chunk bytes are one zstd frame
BLOB_LAST = 2  # frame flag of BLOB_CHUNK: the blob's last chunk
MAX_BLOB_CHUNK_BYTES = 4 << 20  # a blob travels in chunks of at most this many bytes


class MsgType(enum.IntEnum):
    PING = 1  # payload: opaque bytes, echoed back
    PONG = 2
    BULK = 3  # payload: filler bytes for throughput probes
    BULK_DONE = 4  # payload: u64 total bytes received
    TENSOR = 16  # payload: a compression-library payload (activations, gradients, all-reduce chunks)
    CONTROL = 17  # payload: msgpack control message
    # Live state transfer (peer/state/transfer.py): a request, the holder's signed manifest, then chunks.
    STATE_REQUEST = 32  # payload: JSON {"job", "step", "first", "last"}: which layers at which step
    STATE_MANIFEST = 33  # payload: 64-byte Ed25519 signature || canonical JSON manifest
    STATE_CHUNKS = 34  # payload: JSON list of chunk indices to send, in order
    STATE_CHUNK = 35  # payload: u32 chunk index || chunk bytes (zstd frame when flags & STATE_ZSTD)
    # Content-addressed files (transfer/blobs.py): a corpus's manifest and token shards, by SHA-256.
    BLOB_REQUEST = 40  # payload: JSON {"sha256", "admission"?}
    BLOB_CHUNK = 41  # payload: the next bytes of the blob (flags & BLOB_LAST on the last)
    RECORD = 48  # payload: msgpack [name, expiration, envelope bytes]: a signed record pushed (net/push.py)
    ERROR = 255  # payload: UTF-8 reason


# Largest payload accepted per type, bytes. TENSOR is bounded by the codec's own header checks too.
MAX_PAYLOAD: dict[MsgType, int] = {
    MsgType.PING: 1024,
    MsgType.PONG: 1024,
    MsgType.BULK: 1 << 20,
    MsgType.BULK_DONE: 8,
    MsgType.TENSOR: 256 << 20,
    MsgType.CONTROL: 1 << 16,
    MsgType.STATE_REQUEST: 4096,
    MsgType.STATE_MANIFEST: 16 << 20,  # ~200 B per tensor + 65 B per 1 MiB chunk: a 500 GB stage fits
    MsgType.STATE_CHUNKS: 1 << 16,
    MsgType.STATE_CHUNK: MAX_STATE_CHUNK_BYTES + 4 + 4096,  # index + zstd's worst-case framing growth
    MsgType.BLOB_REQUEST: 4096,
    MsgType.BLOB_CHUNK: MAX_BLOB_CHUNK_BYTES,
    MsgType.RECORD: (1 << 20) + 1024,  # a swarm's record limit (64 KiB by default) may be raised to 1 MiB
    MsgType.ERROR: 4096,
}


@dataclass(frozen=True)
class Frame:
    type: MsgType
    payload: bytes
    flags: int = 0


def encode_header(msg_type: MsgType, length: int, flags: int = 0) -> bytes:
    if length > MAX_PAYLOAD[msg_type]:
        raise WireError(f"{msg_type.name} payload of {length} bytes exceeds {MAX_PAYLOAD[msg_type]}")
    return HEADER.pack(MAGIC, VERSION, int(msg_type), flags, length)


def decode_header(header: bytes) -> tuple[MsgType, int, int]:
    """(type, flags, length) of a header, validated against the per-type limit."""
    magic, version, type_code, flags, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise WireError("bad frame magic: the peer does not speak potluck's wire protocol")
    if version != VERSION:
        raise WireError(f"unsupported wire version {version} (this peer speaks {VERSION})")
    try:
        msg_type = MsgType(type_code)
    except ValueError:
        raise WireError(f"unknown message type {type_code}") from None
    if length > MAX_PAYLOAD[msg_type]:
        raise WireError(f"{msg_type.name} frame declares {length} bytes, limit {MAX_PAYLOAD[msg_type]}")
    return msg_type, flags, length


async def write_frame(writer: asyncio.StreamWriter, frame: Frame, timeout_s: float) -> None:
    writer.write(encode_header(frame.type, len(frame.payload), frame.flags))
    writer.write(frame.payload)
    await drain(writer, frame.type, timeout_s)


async def drain(writer: asyncio.StreamWriter, kind: MsgType, timeout_s: float) -> None:
    """Wait until the peer took what was written of a ``kind`` frame; ``WireError`` after ``timeout_s``
    or when the peer closed the stream."""
    try:
        await asyncio.wait_for(writer.drain(), timeout_s)
    except TimeoutError:
        raise WireError(f"peer did not accept a {kind.name} frame within {timeout_s:.1f} s") from None
    except ConnectionError as e:  # reset or broken pipe: the peer closed the stream
        raise WireError(f"peer closed the stream ({e.__class__.__name__})") from None


async def read_exactly(reader: asyncio.StreamReader, n: int, timeout_s: float) -> bytes:
    """``n`` bytes, or ``WireError`` on timeout, EOF or a reset."""
    try:
        return await asyncio.wait_for(reader.readexactly(n), timeout_s) if n else b""
    except TimeoutError:
        raise WireError(f"no frame from peer within {timeout_s:.1f} s") from None
    except asyncio.IncompleteReadError as e:
        raise WireError("peer closed the stream" + (" mid-frame" if e.partial else "")) from None
    except ConnectionError as e:  # a reset instead of an orderly close: the same to the reader
        raise WireError(f"peer closed the stream ({e.__class__.__name__})") from None


async def discard_exactly(reader: asyncio.StreamReader, n: int, timeout_s: float) -> None:
    """Read and drop ``n`` bytes, 64 KiB at a time (a refused message costs no memory)."""
    while n > 0:
        n -= len(await read_exactly(reader, min(n, 1 << 16), timeout_s))


async def read_header(
    reader: asyncio.StreamReader, timeout_s: float, expect: set[MsgType] | None = None
) -> tuple[MsgType, int, int]:
    """(type, flags, length) of the next frame, checked, before its payload is read (or allocated)."""
    msg_type, flags, length = decode_header(await read_exactly(reader, HEADER_BYTES, timeout_s))
    if expect is not None and msg_type not in expect and msg_type != MsgType.ERROR:
        raise WireError(f"expected {sorted(t.name for t in expect)}, got {msg_type.name}")
    return msg_type, flags, length


async def read_frame(
    reader: asyncio.StreamReader, timeout_s: float, expect: set[MsgType] | None = None
) -> Frame:
    """Read one frame; raise ``WireError`` on timeout, EOF, bad header, oversize or unexpected type."""
    msg_type, flags, length = await read_header(reader, timeout_s, expect)
    payload = await read_exactly(reader, length, timeout_s)
    if msg_type == MsgType.ERROR:
        raise WireError(f"peer reported an error: {payload.decode('utf-8', 'replace')}")
    return Frame(msg_type, payload, flags)
