"""Signed records pushed straight to the peers that need them, besides the DHT.

A new plan reaches a peer through its next plan poll (every second) and a DHT read that may first find
a replica still holding the old value: in churn run Y a survivor took its new plan 3.6 s after the
coordinator published it, while the whole pipeline waited for it. So the coordinator also opens a
stream to each peer the plan concerns and writes the very envelope it stored. The receiver checks it
exactly as it checks a DHT read (``envelope.verify``: swarm, key, expiry, size, signature, signer,
schema), so a push can carry nothing a DHT record could not; it only saves the wait. A push that fails
changes nothing: the DHT still has the record.

Wire (``potluck/<swarm>/push/1``): one ``RECORD`` frame per stream (``protocol/wire.py``, its length
checked from the header before the payload is read), msgpack ``[name, expiration, value]`` with
``value`` the envelope bytes as stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence

import msgpack
from hivemind.utils import get_dht_time

from potluck.net.streams import Streams
from potluck.net.validator import verify_read
from potluck.protocol import envelope
from potluck.protocol.errors import DialError, RecordError, WireError
from potluck.protocol.wire import Frame, MsgType, read_frame, write_frame

logger = logging.getLogger(__name__)

PUSH_TIMEOUT_S = 2.0  # one push: open, write, close (a peer it does not reach reads the DHT instead)
READ_TIMEOUT_S = 5.0  # the receiver's wait for a pusher's one frame

OnRecord = Callable[[envelope.Verified], Awaitable[None]]


def push_protocol(swarm_id: str) -> str:
    return f"potluck/{swarm_id}/push/1"


def encode_push(name: str, expiration: float, value: bytes) -> bytes:
    return bytes(msgpack.packb([name, expiration, value], use_bin_type=True))


def decode_push(payload: bytes) -> tuple[str, float, bytes]:
    """``(name, expiration, value)`` of a ``RECORD`` frame's payload; ``RecordError`` if it is not one."""
    try:
        fields = msgpack.unpackb(payload, raw=False, strict_map_key=True, max_bin_len=len(payload))
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise RecordError(f"malformed push: {e}") from None
    ok = isinstance(fields, list) and len(fields) == 3
    expiry = fields[1] if ok else None
    timed = isinstance(expiry, float | int) and not isinstance(expiry, bool)
    if not ok or not isinstance(fields[0], str) or not timed or not isinstance(fields[2], bytes):
        raise RecordError("malformed push: not [name, expiration, value]")
    return fields[0], float(fields[1]), fields[2]


async def push(
    streams: Streams, swarm_id: str, peers: Collection[str], name: str, expiration: float, value: bytes
) -> int:
    """Write the record to each of ``peers`` at once, each within ``PUSH_TIMEOUT_S``; returns how many
    took it (the others read the DHT at their next poll)."""
    frame = Frame(MsgType.RECORD, encode_push(name, expiration, value))
    protocol = push_protocol(swarm_id)

    async def one(peer: str) -> bool:
        try:
            async with asyncio.timeout(PUSH_TIMEOUT_S):
                _, writer = await streams.open(peer, protocol, PUSH_TIMEOUT_S)
                try:
                    await write_frame(writer, frame, PUSH_TIMEOUT_S)
                finally:
                    writer.close()
            return True
        except (DialError, WireError, OSError, TimeoutError) as e:
            logger.debug("push of %s to %s failed: %s", name, peer, e)
            return False

    done = await asyncio.gather(*(one(p) for p in sorted(set(peers)) if p != streams.peer_id))
    return sum(done)


async def serve_pushes(
    streams: Streams, policy: envelope.TrustPolicy, names: Callable[[], Sequence[str]], on_record: OnRecord
) -> None:
    """Take pushed records of the names ``names()`` lists now; each is verified as a DHT read is, then
    handed to ``on_record``. Anything else is dropped, with the reason at debug level (anyone may open
    a stream; a bad push costs its sender the stream, the receiver one bounded read)."""

    async def handle(peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            frame = await read_frame(reader, READ_TIMEOUT_S, expect={MsgType.RECORD})
            name, expiration, value = decode_push(frame.payload)
            if name not in names():
                raise RecordError(f"push of {name!r}, not a record this peer takes pushed")
            verified = verify_read(policy, name, None, value, expiration, get_dht_time())
        except (RecordError, WireError) as e:
            logger.debug("push from %s dropped: %s", peer, e)
            return
        await on_record(verified)

    await streams.serve(push_protocol(policy.swarm_id), handle)
