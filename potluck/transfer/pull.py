"""Fetching layers [first, last) of a stage from live holders, chunks spread over all of them.

1. Every holder gets the request; each answers with its signed manifest (``manifest.parse`` verifies the
   signature against the holder's peer id and bounds every claimed size before anything is allocated).
2. Manifests must be the state asked for (``check_want``) and agree with each other: the largest group
   of identical content wins, holders outside it are dropped (a replica that diverged is not trusted).
3. One buffer of the manifest's size is allocated; each holder's session takes batches of chunk indices
   from a shared queue (two batches in flight per holder, so a round trip is never idle time). Every chunk
   is decompressed with its size bounded, hashed and checked before it is copied into the buffer.
4. A holder that fails (timeout, lost stream, bad chunk) is dropped and the chunks it still owed go back
   to the queue for the others: a transfer completes while one holder is left. All gone: ``StateError``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import zstandard

from potluck.net.pace import Throttle
from potluck.net.streams import Streams
from potluck.protocol.errors import DialError, WireError
from potluck.protocol.wire import STATE_ZSTD, Frame, MsgType, read_frame, write_frame
from potluck.transfer import manifest as mf
from potluck.transfer.errors import StateError, TransferError
from potluck.transfer.server import INDEX, TransferConfig, encode_request
from potluck.transfer.snapshot import check_covers, unpack

logger = logging.getLogger(__name__)


@dataclass
class _Session:
    holder: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    manifest: mf.StateManifest
    error: str | None = None  # why this holder was dropped
    received: int = 0  # chunks delivered and verified


@dataclass
class _Progress:
    manifest: mf.StateManifest
    data: bytearray
    queue: collections.deque[int]
    done: set[int] = field(default_factory=set)
    pacer: Throttle = field(default_factory=lambda: Throttle(lambda: None))  # the cap on the whole fetch
    started: float = field(default_factory=time.monotonic)


async def _open(
    streams: Streams, protocol: str, holder: str, want: mf.StateWant, cfg: TransferConfig
) -> _Session:
    reader, writer = await streams.open(holder, protocol, cfg.timeout_s)
    try:
        request = encode_request(want.job, want.step, want.first, want.last, streams.credentials())
        await write_frame(writer, Frame(MsgType.STATE_REQUEST, request), cfg.timeout_s)
        frame = await read_frame(reader, cfg.timeout_s, expect={MsgType.STATE_MANIFEST})
        manifest = mf.parse(frame.payload, holder, cfg.max_bytes)
        mf.check_want(manifest, want)
    except BaseException:
        writer.close()
        raise
    return _Session(holder, reader, writer, manifest)


def _decode(manifest: mf.StateManifest, frame: Frame, expected: int) -> bytes:
    """Chunk ``expected`` from a STATE_CHUNK frame, size-bounded and hash-checked, or TransferError."""
    if len(frame.payload) < INDEX.size:
        raise TransferError(f"chunk frame from {manifest.holder} too short")
    (index,) = INDEX.unpack_from(frame.payload)
    if index != expected:
        raise TransferError(f"{manifest.holder} sent chunk {index}, expected {expected}")
    body = frame.payload[INDEX.size :]
    start, end = manifest.chunk_span(index)
    if frame.flags & STATE_ZSTD:
        try:  # a declared size other than the manifest's is refused before zstd allocates it
            declared = zstandard.frame_content_size(body)
            if declared not in (-1, end - start):
                raise TransferError(f"chunk {index} from {manifest.holder} declares {declared} bytes")
            body = zstandard.ZstdDecompressor().decompress(body, max_output_size=end - start)
        except zstandard.ZstdError as e:
            raise TransferError(f"chunk {index} from {manifest.holder} does not decompress: {e}") from None
    mf.check_chunk(manifest, index, body)
    return body


async def _serve_session(s: _Session, p: _Progress, cfg: TransferConfig) -> None:
    """Pull batches from the queue through ``s`` until the queue is empty or ``s`` fails."""
    in_flight: collections.deque[list[int]] = collections.deque()
    try:
        while True:
            while len(in_flight) < 2 and p.queue:
                batch = [p.queue.popleft() for _ in range(min(cfg.batch_chunks, len(p.queue)))]
                in_flight.append(batch)
                await write_frame(
                    s.writer, Frame(MsgType.STATE_CHUNKS, json.dumps(batch).encode()), cfg.timeout_s
                )
            if not in_flight:
                return
            batch = in_flight[0]
            while batch:
                frame = await read_frame(s.reader, cfg.timeout_s, expect={MsgType.STATE_CHUNK})
                chunk = await asyncio.to_thread(_decode, s.manifest, frame, batch[0])
                start, end = s.manifest.chunk_span(batch[0])
                p.data[start:end] = chunk
                p.done.add(batch.pop(0))
                s.received += 1
                await p.pacer.wait(end - start)
            in_flight.popleft()
    except (WireError, TransferError) as e:
        s.error = str(e)
        owed = [i for batch in in_flight for i in batch]
        p.queue.extendleft(reversed(owed))  # first in line for the holders that remain
        logger.warning(
            "state transfer from %s failed, %d chunks go to other holders: %s", s.holder, len(owed), e
        )
        s.writer.close()


def _agreeing(sessions: list[_Session]) -> list[_Session]:
    """The sessions whose manifests describe the most common bytes; the others are closed."""
    groups: dict[str, list[_Session]] = collections.defaultdict(list)
    for s in sessions:
        groups[json.dumps(s.manifest.data(), sort_keys=True)].append(s)
    best = max(groups.values(), key=len)
    for s in sessions:
        if s not in best:
            logger.warning("holder %s serves different state than %d others; not used", s.holder, len(best))
            s.writer.close()
    return best


async def pull_state(
    streams: Streams, protocol: str, holders: Sequence[str], want: mf.StateWant, cfg: TransferConfig
) -> dict[str, torch.Tensor]:
    """The tensors of ``want`` (globally named layers) from ``holders``; ``StateError`` if none can."""
    if not holders:
        raise StateError(f"no holders to fetch layers [{want.first}, {want.last}) from")
    opened = await asyncio.gather(
        *(_open(streams, protocol, h, want, cfg) for h in dict.fromkeys(holders)), return_exceptions=True
    )
    faults = [
        f"{h}: {r}"
        for h, r in zip(dict.fromkeys(holders), opened, strict=True)
        if isinstance(r, BaseException)
    ]
    for r in opened:
        if isinstance(r, BaseException) and not isinstance(r, Exception):
            raise r  # cancellation and the like are not a holder's fault
    sessions = [r for r in opened if isinstance(r, _Session)]
    unreachable = [h for h, r in zip(dict.fromkeys(holders), opened, strict=True) if isinstance(r, DialError)]
    if not sessions:
        raise StateError(
            f"no holder served layers [{want.first}, {want.last}) at step {want.step}: {faults}",
            unreachable,
            settling=len(unreachable) < len(opened),  # a live holder without it yet may have it soon
        )
    sessions = _agreeing(sessions)
    manifest = sessions[0].manifest
    queue = collections.deque(range(len(manifest.chunks)))
    # a fetch capped at ``cfg.rate_bytes_s`` (0: none) waits after each chunk while it runs ahead of it
    p = _Progress(manifest, bytearray(manifest.total_bytes), queue, pacer=Throttle(lambda: cfg.rate_bytes_s))
    try:
        while len(p.done) < len(manifest.chunks):
            alive = [s for s in sessions if s.error is None]
            if not alive:
                faults += [f"{s.holder}: {s.error}" for s in sessions]
                raise StateError(
                    f"every holder failed with {len(p.queue)} chunks left: {faults}",
                    unreachable,
                    settling=True,
                )
            await asyncio.gather(*(_serve_session(s, p, cfg) for s in alive))
    finally:
        for s in sessions:
            s.writer.close()
    logger.info(  # scripts/bench_churn.py reads this line: bytes and seconds of each state transfer
        "fetched %d bytes of layers [%d, %d) in %.3f s from %s",
        manifest.total_bytes,
        want.first,
        want.last,
        time.monotonic() - p.started,
        {s.holder: s.received for s in sessions},
    )
    tensors = unpack(manifest.tensors, p.data)
    check_covers(tensors, want.first, want.last, want.model.n_layers, ", ".join(s.holder for s in sessions))
    return tensors
