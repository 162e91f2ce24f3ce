"""The class-parallel stream protocol (``classpar/swarm/streams.py``) over in-memory streams: scores and model
blobs round-trip, and refusals, mismatched replies and oversized or altered blobs are errors."""

import asyncio
import hashlib

import numpy as np
import pytest

from potluck.classpar.swarm.streams import ScoresRequest, ask_scores, fetch_blob, serve_classpar
from potluck.protocol.errors import WireError

SWARM = "swarm-a"
BLOB = b"model bytes " * 100
SHA = hashlib.sha256(BLOB).hexdigest()


class Writer:
    """The writing end of an in-memory stream: what is written is read from ``reader``."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    def write(self, data: bytes) -> None:
        self.reader.feed_data(data)

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        if not self.reader.at_eof():
            self.reader.feed_eof()


class FakeStreams:
    """``Streams`` with its handlers called in-process; the asker shows ``admission``."""

    def __init__(self, admission: bytes | None) -> None:
        self.handlers = {}
        self.credentials = lambda: admission
        self.tasks = []

    async def serve(self, protocol, handler) -> None:
        self.handlers[protocol] = handler

    async def open(self, peer, protocol, timeout_s):
        to_server, to_client = asyncio.StreamReader(), asyncio.StreamReader()
        server_writer = Writer(to_client)

        async def run() -> None:
            try:
                await self.handlers[protocol]("asker", to_server, server_writer)
            finally:
                server_writer.close()

        self.tasks.append(asyncio.create_task(run()))
        return to_client, Writer(to_server)


def serve(admission: bytes | None, reply_rows: int = 0, blob: bytes = BLOB):
    streams = FakeStreams(admission)

    async def scores(job: str, worker: int, x: np.ndarray) -> np.ndarray:
        if worker >= 2:  # a parity
            return np.full((len(x) + reply_rows, 5), 0.25, dtype=np.float64)
        return np.full((len(x) + reply_rows, 5), float(worker), dtype=np.float32)

    async def blobs(job: str, sha: str) -> bytes | None:
        return blob if sha == SHA else None

    async def start() -> FakeStreams:
        await serve_classpar(streams, SWARM, scores, blobs, lambda peer, adm: adm == b"ok", 5.0)
        return streams

    return start


def run(start, ask):
    async def main():
        streams = await start()
        return await ask(streams)

    return asyncio.run(main())


X = np.zeros((3, 1, 16, 16), dtype=np.float32)


def test_scores_round_trip_as_float32_or_float64():
    got = run(serve(b"ok"), lambda s: ask_scores(s, "holder", SWARM, ScoresRequest("bars", 1, 7, X), 5.0))
    assert got.dtype == np.float32 and got.shape == (3, 5) and (got == 1.0).all()
    parity = run(serve(b"ok"), lambda s: ask_scores(s, "holder", SWARM, ScoresRequest("bars", 2, 7, X), 5.0))
    assert parity.dtype == np.float64 and (parity == 0.25).all()


def test_unadmitted_askers_and_mismatched_replies_are_errors():
    with pytest.raises(WireError, match="not admitted"):
        run(serve(None), lambda s: ask_scores(s, "holder", SWARM, ScoresRequest("bars", 0, 1, X), 5.0))
    with pytest.raises(WireError, match="reply shape"):
        run(
            serve(b"ok", reply_rows=1),
            lambda s: ask_scores(s, "h", SWARM, ScoresRequest("bars", 0, 1, X), 5.0),
        )


def test_blobs_are_fetched_whole_and_checked():
    assert run(serve(b"ok"), lambda s: fetch_blob(s, "holder", SWARM, "bars", SHA, 5.0, 1 << 20)) == BLOB
    with pytest.raises(WireError, match="no such model"):
        run(serve(b"ok"), lambda s: fetch_blob(s, "holder", SWARM, "bars", "ab" * 32, 5.0, 1 << 20))
    with pytest.raises(WireError, match="more than"):
        run(serve(b"ok"), lambda s: fetch_blob(s, "holder", SWARM, "bars", SHA, 5.0, 100))
    with pytest.raises(WireError, match="hash"):
        run(
            serve(b"ok", blob=b"other bytes"),
            lambda s: fetch_blob(s, "holder", SWARM, "bars", SHA, 5.0, 1 << 20),
        )
