"""Serving a stage's live state to other peers over the swarm (the fetching side: ``pull.py``).

Protocol ``potluck/{swarm}/state/1``, one conversation per stream, every frame a ``protocol.wire`` frame:

    fetcher -> holder   STATE_REQUEST   {"job", "step", "first", "last"}
    holder -> fetcher   STATE_MANIFEST  signature || manifest (``manifest.py``), or ERROR "why not"
    fetcher -> holder   STATE_CHUNKS    [i, j, ...]        (repeated: the fetcher spreads chunks over holders)
    holder -> fetcher   STATE_CHUNK     u32 index || bytes, one per index in the order asked; zstd-compressed
                                        (flag STATE_ZSTD) when that is smaller, raw otherwise

The holder serves what it was last offered (``offer``): a ``StageState`` whose tensors do not change; when
that is not what is asked, the checkpoints it keeps for the job (``serve_disk``: its own stages, copies
it keeps for others, or the job owner's complete copy) at the asked step, re-cut to the asked layers. A
manifest for each asked range is built once (select, pack, hash, sign, in a worker thread) and kept until
the next offer. Every read has a timeout; a fetcher that goes quiet costs one stream for ``timeout_s``.
While the peer trains, chunks go out at a share of its uplink (``pace.py``): training traffic first.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zstandard

from potluck.model.resume import holds, load_layers, present_stages
from potluck.net.pace import Throttle, write_paced
from potluck.net.streams import Streams
from potluck.protocol.checkpoints import step_dir
from potluck.protocol.errors import CheckpointError, WireError
from potluck.protocol.identity import Identity
from potluck.protocol.wire import MAX_STATE_CHUNK_BYTES, STATE_ZSTD, Frame, MsgType, read_frame, write_frame
from potluck.transfer.errors import TransferError
from potluck.transfer.manifest import CHUNK_BYTES, StateManifest, chunk_hashes
from potluck.transfer.pace import SERVE_SHARE
from potluck.transfer.snapshot import StageState, pack, rename, select

logger = logging.getLogger(__name__)

INDEX = struct.Struct("<I")  # the chunk index in front of each STATE_CHUNK payload
MAX_CACHED = 4  # prepared ranges kept per offer: a re-plan asks each holder for a few ranges at most


def state_protocol(swarm_id: str) -> str:
    return f"potluck/{swarm_id}/state/1"


@dataclass(frozen=True)
class TransferConfig:
    chunk_bytes: int = CHUNK_BYTES
    timeout_s: float = 10.0  # longest wait for any one frame or stream, seconds
    deadline_s: float = 600.0  # a whole fetch, seconds (1 GB at 2 MB/s)
    settle_s: float = 30.0  # keep asking holders that have no state yet this long, seconds
    batch_chunks: int = 8  # chunks asked per STATE_CHUNKS request; two requests stay in flight
    zstd_level: int = 1  # fast: weights barely compress, and the link, not the CPU, should be the limit
    max_bytes: int = 64 << 30  # largest state a fetch allocates, bytes (the fetcher's memory budget)
    # Most bytes/s one fetch takes, summed over its holders (0: as fast as the links go). For background
    # copies (the job owner's checkpoint pull) that must leave a home uplink to the training traffic.
    rate_bytes_s: float = 0.0
    # Older states served from memory besides the newest (``StateServer.offer``): how many, and how many
    # bytes of host memory they may take together. A state some stage's only other holder lost may be
    # the one the next plan resumes from (churn run X: peers moved between layer cuts dropped the pieces
    # of the step every stage still had, and the swarm restarted from step 0).
    keep_states: int = 3
    keep_bytes: int = 4 << 30
    # While this peer trains, the most of its uplink serving state takes, summed over its streams
    # (``pace.py``: training traffic keeps the rest); 1: no cap. Applies where the server is told the
    # uplink and whether it trains (``StateServer(uplink=...)``).
    serve_share: float = SERVE_SHARE

    def __post_init__(self) -> None:
        if not 0 < self.chunk_bytes <= MAX_STATE_CHUNK_BYTES:
            raise ValueError(f"chunk_bytes must be in (0, {MAX_STATE_CHUNK_BYTES}], got {self.chunk_bytes}")
        if (
            min(self.timeout_s, self.deadline_s) <= 0
            or self.settle_s < 0
            or self.batch_chunks < 1
            or self.max_bytes < 0
            or self.rate_bytes_s < 0
            or self.keep_states < 0
            or self.keep_bytes < 0
            or not 0 < self.serve_share <= 1
        ):
            raise ValueError(
                "timeouts and batch_chunks must be positive; max_bytes, rate_bytes_s, keep_states and "
                "keep_bytes non-negative; serve_share in (0, 1]"
            )


@dataclass(frozen=True)
class Served:
    """One prepared range: its manifest, the signed payload and the byte stream it describes."""

    manifest: StateManifest
    payload: bytes
    data: bytearray


def parse_request(payload: bytes) -> tuple[str, int, int, int, bytes | None]:
    """(job, step, first, last, the asker's admission or None) of a STATE_REQUEST; ``TransferError``
    when malformed."""
    try:
        doc = json.loads(payload)
        job, step, first, last = doc["job"], doc["step"], doc["first"], doc["last"]
        admission = doc.get("admission")
        admission = None if admission is None else base64.b64decode(admission, validate=True)
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise TransferError(f"malformed state request: {e}") from None
    if not isinstance(job, str) or not all(type(v) is int and v >= 0 for v in (step, first, last)):
        raise TransferError("malformed state request: job must be a string, step and layers integers")
    return job, step, first, last, admission


def encode_request(job: str, step: int, first: int, last: int, admission: bytes | None = None) -> bytes:
    doc: dict[str, object] = {"job": job, "step": step, "first": first, "last": last}
    if admission is not None:
        doc["admission"] = base64.b64encode(admission).decode("ascii")
    return json.dumps(doc).encode()


Gate = Callable[[str, bytes | None], bool]  # (asker, its admission) -> may it have our state?


class StateServer:
    """Serves the state this peer offers to the peers of the swarm that ask (``gate``: only those it
    lets through, e.g. admitted ones; None: any). ``uplink()``: this peer's uplink in bytes/s while it
    trains, None while it does not (or does not know it): chunks then go out at ``cfg.serve_share`` of
    it (``pace.py``); without ``uplink``, unpaced."""

    def __init__(
        self,
        streams: Streams,
        swarm_id: str,
        identity: Identity,
        cfg: TransferConfig,
        gate: Gate | None = None,
        uplink: Callable[[], float | None] | None = None,
    ) -> None:
        if identity.peer_id != streams.peer_id:
            raise ValueError(f"identity {identity.peer_id} is not the daemon's {streams.peer_id}")
        self.streams, self.identity, self.cfg, self.gate = streams, identity, cfg, gate
        self.pacer = Throttle(lambda: self._rate(uplink))
        self.protocol = state_protocol(swarm_id)
        self._state: StageState | None = None
        # Older states of the same job still offered, newest first (``offer``)
        self._older: list[StageState] = []
        self._live: Callable[[], StageState | None] | None = None  # a running trainer's snapshot
        self._served: dict[tuple[str, int, int, int], asyncio.Task[Served]] = {}
        self._disk: dict[str, Path] = {}  # job name -> the checkpoint directory served for it
        self.bytes_sent = 0
        self.refused = 0  # requests from peers the gate did not let through
        self._serving = 0  # streams sending chunks now: they share the pace

    def _rate(self, uplink: Callable[[], float | None] | None) -> float | None:
        """Bytes/s serving may take now; None: no cap. Never so little that a chunk, sharing the pace
        with the other streams being served, takes more than half a fetcher's frame timeout to arrive:
        on a slow uplink the share gives way rather than fail every fetch."""
        if uplink is None or self.cfg.serve_share >= 1 or (up := uplink()) is None:
            return None
        floor = max(self._serving, 1) * self.cfg.chunk_bytes / (self.cfg.timeout_s / 2)
        return max(self.cfg.serve_share * up, floor)

    async def start(self) -> None:
        await self.streams.serve(self.protocol, self._handle)

    async def close(self) -> None:
        await self.streams.unserve(self.protocol)

    def offer(self, state: StageState | None) -> None:
        """Serve ``state`` from now on (None: serve nothing); conversations under way keep the old one.

        The states offered before stay offered too, newest first, while they are of the same job and
        ``state`` does not cover them (same step, its layers inside), up to ``keep_states`` of them in
        ``keep_bytes``: the coordinator resumes from the newest step whose every layer some live peer
        holds, and when a stage's last holder of a newer step dies, that is an older step held in
        pieces, by peers that have moved to other layers since (``Progress.also_holds`` reports them)."""
        older: list[StageState] = []
        if state is not None:
            new = state.meta
            for old in self.offered_all:
                a = old.meta
                covered = (a.job, a.step) == (new.job, new.step) and (
                    new.first_layer <= a.first_layer < a.last_layer <= new.last_layer
                )
                if a.job == new.job and not covered:
                    older.append(old)
            older = self._within_budget(older)
        self._state, self._older, self._served = state, older, {}

    def _within_budget(self, older: list[StageState]) -> list[StageState]:
        """The newest of ``older`` that fit ``keep_states`` and ``keep_bytes``."""
        kept: list[StageState] = []
        total = 0
        for s in older[: self.cfg.keep_states]:
            size = sum(t.numel() * t.element_size() for t in s.tensors.values())
            if total + size > self.cfg.keep_bytes:
                break
            kept.append(s)
            total += size
        return kept

    def offer_live(self, snapshot: Callable[[], StageState | None] | None) -> None:
        """Also serve what ``snapshot()`` returns when asked (a running trainer's state between steps;
        None when torn): a peer still inside a step its pipeline cannot finish is the last holder of
        its layers until it gives up, and the peers of the next plan must not wait for that."""
        self._live = snapshot

    @property
    def offered(self) -> StageState | None:
        return self._state

    @property
    def offered_all(self) -> list[StageState]:
        """Every state offered from memory (not the running trainer's), newest first."""
        return [self._state, *self._older] if self._state is not None else []

    def serve_disk(self, job: str, root: Path | None) -> None:
        """Also serve the checkpoints of ``job`` kept under ``root`` (None: no longer)."""
        if root is None:
            self._disk.pop(job, None)
        else:
            self._disk[job] = Path(root)

    def _from_disk(self, job: str, step: int, first: int, last: int) -> StageState:
        """Layers [first, last) of ``job`` after ``step`` steps from its checkpoint directory."""
        root = self._disk.get(job)  # only a job this peer was told about: never a path from the wire
        if root is None or not holds(root, step, first, last):
            raise TransferError(f"no checkpoint of {job!r} step {step} layers [{first}, {last}) here")
        try:
            stages = present_stages(step_dir(root, step))
            base = next(m.meta for m in stages if m.meta.first_layer <= first < m.meta.last_layer)
            tensors = load_layers(root, step, first, last, base.model.n_layers)
        except CheckpointError as e:
            raise TransferError(f"checkpoint of {job!r} step {step} unusable: {e}") from None
        return StageState(base.model_copy(update={"first_layer": first, "last_layer": last}), tensors)

    def _prepare(self, state: StageState, first: int, last: int) -> Served:
        meta = state.meta
        tensors = select(rename(state.tensors, meta.first_layer), first, last, meta.model.n_layers)
        entries, data = pack(tensors)
        chunks = chunk_hashes(memoryview(data), self.cfg.chunk_bytes)
        manifest = StateManifest(
            self.identity.peer_id, meta, first, last, self.cfg.chunk_bytes, entries, chunks
        )
        return Served(manifest, manifest.signed(self.identity), data)

    def _holds(self, job: str, step: int, first: int, last: int) -> StageState | None:
        def fits(state: StageState | None) -> bool:
            if state is None:
                return False
            meta = state.meta
            return (job, step) == (
                meta.job,
                meta.step,
            ) and meta.first_layer <= first < last <= meta.last_layer

        for state in self.offered_all:
            if fits(state):
                return state
        live = self._live() if self._live is not None else None
        return live if fits(live) else None

    def _load_and_prepare(self, job: str, step: int, first: int, last: int) -> Served:
        return self._prepare(self._from_disk(job, step, first, last), first, last)

    async def _served_for(self, job: str, step: int, first: int, last: int) -> Served:
        key = (job, step, first, last)
        if key not in self._served:
            state = self._holds(job, step, first, last)
            if state is None and job not in self._disk:
                held = self._state.meta if self._state is not None else None
                raise TransferError(
                    "this peer offers no state"
                    if held is None
                    else f"this peer holds {held.job!r} step {held.step} layers [{held.first_layer}, "
                    f"{held.last_layer}), asked {job!r} step {step} layers [{first}, {last})"
                )
            if len(self._served) >= MAX_CACHED:
                self._served.pop(next(iter(self._served)))
            prepare = (
                asyncio.to_thread(self._prepare, state, first, last)
                if state is not None
                else asyncio.to_thread(self._load_and_prepare, job, step, first, last)
            )
            self._served[key] = asyncio.ensure_future(prepare)
        try:
            return await self._served[key]
        except TransferError:
            self._served.pop(key, None)  # the disk may hold it a moment later (a copy being written)
            raise

    def chunk_bytes(self, served: Served, index: int) -> bytes:
        """The raw bytes of chunk ``index`` (a seam for tests that serve corrupted state)."""
        start, end = served.manifest.chunk_span(index)
        return bytes(served.data[start:end])

    def _encode_chunk(self, served: Served, index: int) -> Frame:
        raw = self.chunk_bytes(served, index)
        packed = zstandard.ZstdCompressor(level=self.cfg.zstd_level).compress(raw)
        if len(packed) < len(raw):
            return Frame(MsgType.STATE_CHUNK, INDEX.pack(index) + packed, STATE_ZSTD)
        return Frame(MsgType.STATE_CHUNK, INDEX.pack(index) + raw)

    async def _handle(self, peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        timeout = self.cfg.timeout_s
        try:
            request = await read_frame(reader, timeout, expect={MsgType.STATE_REQUEST})
            job, step, first, last, admission = parse_request(request.payload)
            if self.gate is not None and not self.gate(peer, admission):
                self.refused += 1
                await write_frame(writer, Frame(MsgType.ERROR, b"not admitted to this swarm"), timeout)
                return
            try:
                served = await self._served_for(job, step, first, last)
            except TransferError as e:
                await write_frame(writer, Frame(MsgType.ERROR, str(e)[:4000].encode()), timeout)
                return
            await write_frame(writer, Frame(MsgType.STATE_MANIFEST, served.payload), timeout)
            n_chunks = len(served.manifest.chunks)
            while True:
                try:  # a fetcher waits out a slow co-holder before asking again: idle up to its deadline
                    ask = await read_frame(reader, self.cfg.deadline_s, expect={MsgType.STATE_CHUNKS})
                except WireError as e:
                    if "closed" not in str(e):  # closing the stream is how a fetcher says it is done
                        logger.debug("state stream from %s ended: %s", peer, e)
                    return
                indices = json.loads(ask.payload)
                if not isinstance(indices, list) or not all(
                    type(i) is int and 0 <= i < n_chunks for i in indices
                ):
                    raise TransferError(f"{peer} asked for chunks outside [0, {n_chunks})")
                self._serving += 1  # sending a batch: it shares the pace with the other streams
                try:
                    for i in indices:
                        frame = await asyncio.to_thread(self._encode_chunk, served, i)
                        await write_paced(writer, frame, timeout, self.pacer)
                        self.bytes_sent += len(frame.payload)
                finally:
                    self._serving -= 1
        except (WireError, TransferError, json.JSONDecodeError, UnicodeDecodeError) as e:
            logger.info("state transfer to %s stopped: %s", peer, e)
