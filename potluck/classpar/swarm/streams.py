"""The class-parallel stream protocol ``potluck/<swarm>/classpar/1``: scores and model blobs.

One request per stream, every frame a ``protocol.wire`` frame:

    client -> holder   CONTROL  msgpack {"op": "scores", "job", "worker", "qid", "shape", "x", "admission"}
    holder -> client   CONTROL  msgpack {"qid", "worker", "dtype": "f4" | "f8", "shape", "data"}
    client -> holder   CONTROL  msgpack {"op": "blob", "job", "sha256", "admission"}
    holder -> client   TENSOR   the blob's bytes (the client checks the length before reading, and the hash)

or an ERROR frame saying why not. ``x`` is float32 images (N, 1, H, W), little-endian. A holder serves
admitted peers only (``admission``: the asker's encoded ``Admission``); the client bounds every wait.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgpack
import numpy as np

from potluck.net.dial import AddressBook, open_stream
from potluck.net.streams import Streams
from potluck.protocol.errors import WireError
from potluck.protocol.wire import Frame, MsgType, read_exactly, read_frame, read_header, write_frame

logger = logging.getLogger(__name__)

MAX_IMAGES = 64  # images per scores request
MAX_SIDE = 64  # pixels per image side
MAX_REPLY_VALUES = 1 << 13  # floats in a scores reply (N x |g|): well inside a CONTROL frame


def classpar_protocol(swarm_id: str) -> str:
    return f"potluck/{swarm_id}/classpar/1"


@dataclass(frozen=True)
class ScoresRequest:
    job: str
    worker: int
    qid: int
    x: np.ndarray  # (N, 1, H, W) float32


# What a holder does with requests: scores(job, worker, x) -> reply array; blob(job, sha256) -> bytes
ScoresFn = Callable[[str, int, np.ndarray], Awaitable[np.ndarray]]
BlobFn = Callable[[str, str], Awaitable[bytes | None]]
AllowFn = Callable[[str, bytes | None], bool]


def _images(shape: object, raw: object) -> np.ndarray:
    if not (isinstance(shape, list) and len(shape) == 4 and all(isinstance(d, int) for d in shape)):
        raise ValueError("shape must be 4 integers (N, C, H, W)")
    n, c, h, w = shape
    if not (1 <= n <= MAX_IMAGES and c == 1 and 1 <= h <= MAX_SIDE and 1 <= w <= MAX_SIDE):
        raise ValueError(f"images of shape {shape} are out of bounds")
    if not isinstance(raw, bytes) or len(raw) != 4 * n * c * h * w:
        raise ValueError("image bytes do not match the shape")
    x = np.frombuffer(raw, dtype="<f4").reshape(n, c, h, w)
    if not np.isfinite(x).all():
        raise ValueError("images must be finite")
    return x.astype(np.float32)


async def serve_classpar(
    streams: Streams, swarm_id: str, scores: ScoresFn, blob: BlobFn, allow: AllowFn, timeout_s: float
) -> None:
    """Answer scores and blob requests of admitted peers (``allow``) on ``streams``."""

    async def handle(peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await answer(peer, reader, writer)
        except WireError as e:  # an asker that went away: a client drops the replies it no longer needs
            logger.debug("classpar request from %s ended: %s", peer, e)

    async def answer(peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frame = await read_frame(reader, timeout_s, expect={MsgType.CONTROL})
        try:
            ask = msgpack.unpackb(frame.payload, raw=False, max_map_len=16, max_array_len=8)
            if not isinstance(ask, dict):
                raise ValueError("a request is a map")
            admission = ask.get("admission")
            if not allow(peer, admission if isinstance(admission, bytes) else None):
                raise PermissionError("not admitted to this swarm")
            job, op = ask.get("job"), ask.get("op")
            if not isinstance(job, str):
                raise ValueError("no job named")
            if op == "scores":
                worker, qid = ask.get("worker"), ask.get("qid")
                if not isinstance(worker, int) or not isinstance(qid, int):
                    raise ValueError("worker and qid must be integers")
                reply = await scores(job, worker, _images(ask.get("shape"), ask.get("x")))
                dtype = "f8" if reply.dtype == np.float64 else "f4"
                out = {
                    "qid": qid,
                    "worker": worker,
                    "dtype": dtype,
                    "shape": list(reply.shape),
                    "data": np.ascontiguousarray(reply, dtype="<" + dtype).tobytes(),
                }
                await write_frame(writer, Frame(MsgType.CONTROL, msgpack.packb(out)), timeout_s)
            elif op == "blob":
                sha = ask.get("sha256")
                found = await blob(job, sha) if isinstance(sha, str) else None
                if found is None:
                    raise LookupError("no such model here")
                await write_frame(writer, Frame(MsgType.TENSOR, found), timeout_s)
            else:
                raise ValueError(f"unknown op {op!r}")
        except (ValueError, PermissionError, LookupError) as e:
            await write_frame(writer, Frame(MsgType.ERROR, str(e).encode()[:4000]), timeout_s)

    await streams.serve(classpar_protocol(swarm_id), handle)


async def _ask(
    streams: Streams,
    peer: str,
    swarm_id: str,
    ask: dict[str, object],
    timeout_s: float,
    addresses: AddressBook | None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream with ``ask`` written; with ``addresses`` the dial retries over the peer's announced ones."""
    if addresses is None:
        reader, writer = await streams.open(peer, classpar_protocol(swarm_id), timeout_s)
    else:
        reader, writer = await open_stream(
            streams.p2p, peer, classpar_protocol(swarm_id), timeout_s, addresses
        )
    ask["admission"] = streams.credentials()
    try:
        await write_frame(writer, Frame(MsgType.CONTROL, msgpack.packb(ask)), timeout_s)
    except BaseException:
        writer.close()
        raise
    return reader, writer


async def ask_scores(
    streams: Streams,
    peer: str,
    swarm_id: str,
    req: ScoresRequest,
    timeout_s: float,
    addresses: AddressBook | None = None,
) -> np.ndarray:
    """Coded worker ``req.worker``'s reply from ``peer``: (N, |g|) float32 or float64. ``WireError`` on
    any failure (a dead holder, a refusal, a malformed or mismatched reply)."""
    x = np.ascontiguousarray(req.x, dtype="<f4")
    ask: dict[str, object] = {
        "op": "scores",
        "job": req.job,
        "worker": req.worker,
        "qid": req.qid,
        "shape": list(x.shape),
        "x": x.tobytes(),
    }
    reader, writer = await _ask(streams, peer, swarm_id, ask, timeout_s, addresses)
    try:
        frame = await read_frame(reader, timeout_s, expect={MsgType.CONTROL})
    finally:
        writer.close()
    try:
        rep = msgpack.unpackb(frame.payload, raw=False, max_map_len=8, max_array_len=4)
        dtype, shape, raw = rep["dtype"], rep["shape"], rep["data"]
        if rep["qid"] != req.qid or rep["worker"] != req.worker or dtype not in ("f4", "f8"):
            raise ValueError("a reply to another question")
        n_values = int(np.prod(shape))
        if len(shape) != 2 or shape[0] != x.shape[0] or n_values > MAX_REPLY_VALUES:
            raise ValueError(f"reply shape {shape} for {x.shape[0]} images")
        out = np.frombuffer(raw, dtype="<" + dtype, count=n_values).reshape(shape)
        if len(raw) != out.nbytes or not np.isfinite(out).all():
            raise ValueError("reply bytes do not match its shape, or are not finite")
    except (KeyError, TypeError, ValueError, msgpack.UnpackException) as e:
        raise WireError(f"malformed classpar reply from {peer}: {e}") from None
    return out.astype(np.float64 if dtype == "f8" else np.float32)


async def fetch_blob(
    streams: Streams,
    peer: str,
    swarm_id: str,
    job: str,
    sha256: str,
    timeout_s: float,
    max_bytes: int,
    addresses: AddressBook | None = None,
) -> bytes:
    """The model blob named ``sha256`` from ``peer``, its hash checked; ``WireError`` otherwise."""
    ask: dict[str, object] = {"op": "blob", "job": job, "sha256": sha256}
    reader, writer = await _ask(streams, peer, swarm_id, ask, timeout_s, addresses)
    try:
        msg_type, _, length = await read_header(reader, timeout_s, expect={MsgType.TENSOR})
        if length > max_bytes:
            raise WireError(f"{peer} offers a model of {length} bytes, more than {max_bytes}")
        payload = await read_exactly(reader, length, timeout_s)
    finally:
        writer.close()
    if msg_type == MsgType.ERROR:
        raise WireError(f"{peer} refused: {payload.decode('utf-8', 'replace')}")
    if hashlib.sha256(payload).hexdigest() != sha256:
        raise WireError(f"{peer} sent a model whose hash is not {sha256[:12]}")
    return payload
