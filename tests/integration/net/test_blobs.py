"""Content-addressed blobs between real p2pd daemons: a holder that lies is refused by hash and the
next one asked; a blob larger than the fetcher expects is cut off; an outsider is refused."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from potluck.net.streams import Streams
from potluck.testbed.harness.p2p import keyed_group
from potluck.transfer.blobs import BlobConfig, BlobServer, blob_files, fetch_blob
from potluck.transfer.errors import TransferError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SWARM = "blob-test"
CFG = BlobConfig(timeout_s=5.0, chunk_bytes=64 << 10)


def test_a_lying_holder_is_refused_and_the_next_one_serves(tmp_path: Path) -> None:
    data = bytes(range(256)) * 3000  # 768 KB: several chunks
    sha = hashlib.sha256(data).hexdigest()
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / sha).write_bytes(data)

    async def main() -> None:
        async with keyed_group(4, tmp_path) as nodes:
            (liar, _), (honest, _), (closed, _), (me, _) = nodes
            servers = [
                BlobServer(Streams(liar), SWARM, lambda h: data[:-1] + b"!", cfg=CFG),
                BlobServer(Streams(honest), SWARM, blob_files(tmp_path / "blobs"), cfg=CFG),
                BlobServer(
                    Streams(closed), SWARM, blob_files(tmp_path / "blobs"), gate=lambda p, a: False, cfg=CFG
                ),
            ]
            for server in servers:
                await server.start()
            ids = [p2p.peer_id.to_base58() for p2p, _ in nodes]
            streams = Streams(me)
            got = await fetch_blob(streams, SWARM, ids[:2], sha, len(data), CFG)
            assert got == data and servers[0].bytes_sent > 0 and servers[1].bytes_sent > 0
            with pytest.raises(TransferError, match="more than the 1000 bytes"):
                await fetch_blob(streams, SWARM, ids[1:2], sha, 1000, CFG)
            with pytest.raises(TransferError, match="not admitted"):
                await fetch_blob(streams, SWARM, ids[2:3], sha, len(data), CFG)
            assert servers[2].refused == 1
            with pytest.raises(TransferError, match="no blob"):
                await fetch_blob(streams, SWARM, ids[1:2], "0" * 64, len(data), CFG)
            for server in servers:
                await server.close()

    asyncio.run(main())
