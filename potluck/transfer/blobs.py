"""Content-addressed files over the swarm: a shipped corpus's manifest and token shards, by SHA-256.

Protocol ``potluck/{swarm}/blob/1``, one blob per stream, every frame a ``protocol.wire`` frame:

    fetcher -> holder   BLOB_REQUEST  {"sha256": hex, "admission": base64 (optional)}
    holder -> fetcher   BLOB_CHUNK    ... the blob's bytes, in order; flags BLOB_LAST on the last one
                        or ERROR "why not"

A name is a hash, so a holder can serve nothing but the bytes asked for: the fetcher stops reading once
more than ``max_bytes`` arrive (the size it expects, from a manifest it already trusts) and checks the
hash of what came. A wrong or short blob is that holder's failure, and the next is asked. While the
peer trains, blobs go out at a share of its uplink (``pace.py``), as served state does.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from potluck.net.pace import Throttle, write_paced
from potluck.net.streams import Streams
from potluck.protocol.errors import DialError, WireError
from potluck.protocol.wire import BLOB_LAST, MAX_BLOB_CHUNK_BYTES, Frame, MsgType, read_frame, write_frame
from potluck.transfer.errors import TransferError
from potluck.transfer.server import Gate

logger = logging.getLogger(__name__)

SHA256 = re.compile(r"^[0-9a-f]{64}$")
Lookup = Callable[[str], bytes | None]  # a hash -> the blob's bytes, or None when not held here


def blob_files(directory: Path, max_bytes: int = MAX_BLOB_CHUNK_BYTES * 1024) -> Lookup:
    """Blobs kept as files named by their SHA-256 in ``directory`` (the name is checked before any
    path is built from it; the file's hash is the fetcher's to check)."""

    def lookup(sha: str) -> bytes | None:
        path = directory / sha
        if not SHA256.match(sha) or not path.is_file() or path.stat().st_size > max_bytes:
            return None
        return path.read_bytes()

    return lookup


def blob_protocol(swarm_id: str) -> str:
    return f"potluck/{swarm_id}/blob/1"


@dataclass(frozen=True)
class BlobConfig:
    timeout_s: float = 10.0  # longest wait for a stream or any one frame, seconds
    chunk_bytes: int = 1 << 20


class BlobServer:
    """Answers blob requests from ``lookup``; ``gate``: who may fetch (admitted peers); ``rate``: bytes/s
    serving may take now (None: no cap)."""

    def __init__(
        self,
        streams: Streams,
        swarm_id: str,
        lookup: Lookup,
        gate: Gate | None = None,
        rate: Callable[[], float | None] = lambda: None,
        cfg: BlobConfig = BlobConfig(),
    ) -> None:
        self.streams, self.lookup, self.gate, self.cfg = streams, lookup, gate, cfg
        self.protocol = blob_protocol(swarm_id)
        self.pacer = Throttle(rate)
        self.bytes_sent = 0
        self.refused = 0

    async def start(self) -> None:
        await self.streams.serve(self.protocol, self._handle)

    async def close(self) -> None:
        await self.streams.unserve(self.protocol)

    async def _handle(self, peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        timeout = self.cfg.timeout_s
        try:
            request = await read_frame(reader, timeout, expect={MsgType.BLOB_REQUEST})
            sha, admission = parse_request(request.payload)
            if self.gate is not None and not self.gate(peer, admission):
                self.refused += 1
                await write_frame(writer, Frame(MsgType.ERROR, b"not admitted to this swarm"), timeout)
                return
            data = await asyncio.to_thread(self.lookup, sha)
            if data is None:
                await write_frame(writer, Frame(MsgType.ERROR, f"no blob {sha[:12]} here".encode()), timeout)
                return
            step = self.cfg.chunk_bytes
            for at in range(0, max(len(data), 1), step):
                last = at + step >= len(data)
                frame = Frame(MsgType.BLOB_CHUNK, data[at : at + step], BLOB_LAST if last else 0)
                await write_paced(writer, frame, timeout, self.pacer)
                self.bytes_sent += len(frame.payload)
        except (WireError, TransferError) as e:
            logger.info("blob transfer to %s stopped: %s", peer, e)


def parse_request(payload: bytes) -> tuple[str, bytes | None]:
    try:
        doc = json.loads(payload)
        sha, admission = doc["sha256"], doc.get("admission")
        admission = None if admission is None else base64.b64decode(admission, validate=True)
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise TransferError(f"malformed blob request: {e}") from None
    if not isinstance(sha, str) or not SHA256.match(sha):
        raise TransferError("malformed blob request: sha256 must be 64 lowercase hex digits")
    return sha, admission


def encode_request(sha: str, admission: bytes | None) -> bytes:
    doc: dict[str, object] = {"sha256": sha}
    if admission is not None:
        doc["admission"] = base64.b64encode(admission).decode("ascii")
    return json.dumps(doc).encode()


async def fetch_from(
    streams: Streams, swarm_id: str, peer: str, sha: str, max_bytes: int, cfg: BlobConfig
) -> bytes:
    """Blob ``sha`` from ``peer``: at most ``max_bytes``, hash-checked; ``TransferError`` otherwise."""
    try:
        reader, writer = await streams.open(peer, blob_protocol(swarm_id), cfg.timeout_s)
    except DialError as e:
        raise TransferError(str(e)) from None
    try:
        request = encode_request(sha, streams.credentials())
        await write_frame(writer, Frame(MsgType.BLOB_REQUEST, request), cfg.timeout_s)
        h, parts, size = hashlib.sha256(), [], 0
        while True:
            frame = await read_frame(reader, cfg.timeout_s, expect={MsgType.BLOB_CHUNK, MsgType.ERROR})
            if frame.type == MsgType.ERROR:
                raise TransferError(f"{peer}: {frame.payload[:200].decode(errors='replace')}")
            size += len(frame.payload)
            if size > max_bytes:
                raise TransferError(f"{peer} sent more than the {max_bytes} bytes of blob {sha[:12]}")
            h.update(frame.payload)
            parts.append(frame.payload)
            if frame.flags & BLOB_LAST:
                break
        if h.hexdigest() != sha:
            raise TransferError(f"{peer} sent bytes that do not hash to {sha[:12]}")
        return b"".join(parts)
    except WireError as e:
        raise TransferError(f"blob {sha[:12]} from {peer}: {e}") from None
    finally:
        writer.close()


async def fetch_blob(
    streams: Streams,
    swarm_id: str,
    holders: Sequence[str],
    sha: str,
    max_bytes: int,
    cfg: BlobConfig = BlobConfig(),
) -> bytes:
    """Blob ``sha`` from the first of ``holders`` that has it; ``TransferError`` naming every failure."""
    if max_bytes > MAX_BLOB_CHUNK_BYTES * 1024:
        raise ValueError(f"a blob of up to {max_bytes} bytes is not fetched into memory")
    faults = []
    for peer in holders:
        try:
            return await fetch_from(streams, swarm_id, peer, sha, max_bytes, cfg)
        except TransferError as e:
            logger.debug("blob %s: %s", sha[:12], e)
            faults.append(str(e))
    raise TransferError(f"no holder served blob {sha[:12]}: {faults}")
