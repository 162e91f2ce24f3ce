"""A shipped corpus on this peer: its manifest fetched by the job's fingerprint, its shards fetched as
the steps that read them come, and served to the other peers once here.

Before each step the trainer awaits ``DataFeed.ready(step)``: the shards that step's sequences read
(every replica's: replicas of a step read the same shards) are fetched if missing, and a background
read-ahead then fetches those of the next ``READ_AHEAD_SHARDS`` shards' worth of steps, so a step waits
on the network only when the link is slower than training consumes tokens. A shard is asked of the
plan's other peers first (they read the same shards) and of the job owner last; each is checked
against its hash in the manifest before it is written.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from pathlib import Path

from potluck.model.corpus.build import Corpus, prepare_corpus
from potluck.model.corpus.manifest import MAX_MANIFEST_BYTES, DataManifest, decode_manifest
from potluck.model.corpus.tokens import ShardedTokens
from potluck.model.data import TokenDataset, load_tokenizer
from potluck.model.errors import DataError
from potluck.net.streams import Streams
from potluck.protocol.jobspec import JobSpec
from potluck.transfer.blobs import BlobConfig, BlobServer, fetch_blob
from potluck.transfer.errors import TransferError
from potluck.transfer.server import Gate

logger = logging.getLogger(__name__)

READ_AHEAD_SHARDS = 2  # shards fetched ahead of the step that reads them
MANIFEST = "manifest.json"
FETCH_TRIES = 3  # rounds over the holders before a shard counts as unavailable


class DataFeed:
    def __init__(self, tokens: ShardedTokens, fetch: Callable[[str, int], Awaitable[bytes]], per_step: int):
        self.tokens, self._fetch, self.per_step = tokens, fetch, per_step
        m = tokens.manifest
        self.ahead = max(1, math.ceil(READ_AHEAD_SHARDS * m.shard_tokens / (per_step * tokens.seq_len)))
        self._reading: asyncio.Task[None] | None = None
        self._fetching: dict[int, asyncio.Task[None]] = {}  # one fetch a shard, whoever asks for it
        self.by_hash = {s.sha256: i for i, s in enumerate(m.shards)}

    @property
    def dataset(self) -> TokenDataset:
        return self.tokens.dataset

    async def _get(self, index: int) -> None:
        """Shard ``index`` here: fetched, or awaited where a fetch of it is under way (a step may need
        the shard the read-ahead is fetching)."""
        if index in self.tokens.have:
            return
        task = self._fetching.get(index)
        if task is None:
            task = self._fetching[index] = asyncio.create_task(self._fetch_shard(index))
            task.add_done_callback(lambda _t: self._fetching.pop(index, None))
        await asyncio.shield(task)  # a cancelled read-ahead does not cancel the step's wait, nor the reverse

    async def _fetch_shard(self, index: int) -> None:
        data = await self._fetch(
            self.tokens.manifest.shards[index].sha256, self.tokens.manifest.shard_bytes(index)
        )
        await asyncio.to_thread(self.tokens.put, index, data)

    async def ready(self, step: int) -> None:
        """The shards of ``step`` here (fetched now if needed); the next ones on their way."""
        for index in self.tokens.needed(step, step, self.per_step):
            logger.info("data: fetching shard %d for step %d", index, step)
            await self._get(index)
        if self._reading is None or self._reading.done():
            ahead = self.tokens.needed(step + 1, step + self.ahead, self.per_step)
            if ahead:
                self._reading = asyncio.create_task(self._read_ahead(ahead), name="data-read-ahead")

    async def _read_ahead(self, indices: list[int]) -> None:
        for index in indices:
            try:
                await self._get(index)
            except (TransferError, DataError) as e:  # the step that needs it fetches it again, and says why
                logger.info("data: read-ahead of shard %d failed: %s", index, e)
                return

    def lookup(self, sha: str) -> bytes | None:
        """A blob this peer serves: the manifest, or a shard it has."""
        if sha == self.tokens.manifest.fingerprint:
            return self.tokens.manifest.encode()
        index = self.by_hash.get(sha)
        return None if index is None else self.tokens.shard(index)

    def close(self) -> None:
        for task in [self._reading, *self._fetching.values()]:
            if task is not None:
                task.cancel()


class Feeds:
    """This peer's shipped corpora (one per job it trains) and the server that shares them."""

    def __init__(
        self,
        streams: Streams,
        swarm_id: str,
        root: Path,
        holders: Callable[[], list[str]],
        gate: Gate | None,
        rate: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.streams, self.swarm_id, self.root, self.holders = streams, swarm_id, root, holders
        self.feeds: dict[str, DataFeed] = {}  # by fingerprint
        self.server = BlobServer(streams, swarm_id, self._lookup, gate, rate)
        self.cfg = BlobConfig()

    def _lookup(self, sha: str) -> bytes | None:
        for feed in self.feeds.values():
            if (data := feed.lookup(sha)) is not None:
                return data
        return None

    async def _fetch(self, sha: str, max_bytes: int) -> bytes:
        tries = 0
        while True:
            try:
                return await fetch_blob(self.streams, self.swarm_id, self.holders(), sha, max_bytes, self.cfg)
            except TransferError as e:
                tries += 1
                if tries == FETCH_TRIES:
                    raise TransferError(f"data: {e}") from None
                await asyncio.sleep(0.5 * tries)

    async def open(
        self, job: JobSpec, per_step: int, mirror: tuple[Path, Path | None] | None = None
    ) -> DataFeed:
        """The feed of ``job``'s shipped corpus (its manifest fetched and checked the first time).
        ``mirror``: the volunteer's own copy of the data and the job's tokenizer file on this machine
        (``--data-dir``, ``--tokenizer``): built here and, when it is the job's corpus, used instead
        of fetching."""
        fingerprint = job.data.fingerprint
        assert fingerprint is not None
        if fingerprint in self.feeds:
            return self.feeds[fingerprint]
        directory = self.root / fingerprint
        local = (
            await asyncio.to_thread(mirror_corpus, job, *mirror, self.root / "mirrors") if mirror else None
        )
        manifest = local.manifest if local is not None else await self._manifest(directory, fingerprint)
        tokens = await asyncio.to_thread(ShardedTokens, manifest, directory, job.model.seq_len)
        if local is not None:
            await asyncio.to_thread(fill_from, tokens, local)
        if manifest.eot is not None and manifest.eot >= job.model.vocab_size:
            raise DataError(f"the corpus's end-of-text id {manifest.eot} is outside model.vocab_size")
        feed = DataFeed(tokens, self._fetch, per_step)
        self.feeds[fingerprint] = feed
        logger.info(
            "data: shipped corpus %s: %d tokens in %d shards, %d here",
            fingerprint[:12],
            manifest.tokens,
            len(manifest.shards),
            len(tokens.have),
        )
        return feed

    async def _manifest(self, directory: Path, fingerprint: str) -> DataManifest:
        path = directory / MANIFEST
        if path.is_file():
            try:
                return decode_manifest(path.read_bytes(), fingerprint)
            except DataError as e:
                logger.info("data: cached manifest unusable (%s); fetching it again", e)
        raw = await self._fetch(fingerprint, MAX_MANIFEST_BYTES)
        manifest = decode_manifest(raw, fingerprint)
        directory.mkdir(parents=True, exist_ok=True)
        path.write_bytes(raw)
        return manifest

    async def start(self) -> None:
        await self.server.start()

    async def close(self) -> None:
        for feed in self.feeds.values():
            feed.close()
        await self.server.close()


def mirror_corpus(job: JobSpec, data_dir: Path, tokenizer_file: Path | None, cache: Path) -> Corpus | None:
    """The volunteer's copy of the job's data built as the owner built it: the corpus when its
    fingerprint is the job's, else None (said why at WARNING: the shards are then fetched)."""
    spec = job.data
    try:
        tokenizer = load_tokenizer(str(tokenizer_file) if tokenizer_file is not None else None)
        corpus = prepare_corpus(
            data_dir, spec.text_field, tokenizer, tokenizer_file, job.seed, cache, spec.shard_tokens
        )
    except (DataError, OSError) as e:
        logger.warning("data: your copy under %s is not used (%s); fetching the job's shards", data_dir, e)
        return None
    if corpus.manifest.fingerprint != spec.fingerprint:
        logger.warning(
            "data: your copy under %s differs from the job's data (fingerprint %s, the job's %s); fetching "
            "the job's shards",
            data_dir,
            corpus.manifest.fingerprint[:12],
            (spec.fingerprint or "")[:12],
        )
        return None
    logger.info("data: your copy under %s is the job's corpus; no shard is fetched", data_dir)
    return corpus


def fill_from(tokens: ShardedTokens, corpus: Corpus) -> None:
    """Every shard of ``tokens`` it does not have, from a local corpus of the same manifest."""
    for index, shard in enumerate(tokens.manifest.shards):
        if index not in tokens.have:
            tokens.put(index, (corpus.blobs / shard.sha256).read_bytes())
