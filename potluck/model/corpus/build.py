"""Building a shipped corpus on the job owner's machine, once per source, tokenizer and seed.

Two passes, neither holding the corpus in memory: documents are tokenized in file order into a
scratch token file (each followed by the end-of-text id), remembering where each starts; then they are
copied out in an order the job seed shuffles, into shards of ``shard_tokens`` tokens, each written under
its SHA-256 in ``blobs/`` with the manifest beside them. A later launch of the same source (same files,
sizes and times), tokenizer and seed finds the result in its cache and reuses it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from potluck.model.corpus.documents import documents, source_files
from potluck.model.corpus.manifest import DataManifest, Shard, decode_manifest
from potluck.model.data import ByteTokenizer, HFTokenizer, Tokenizer, pieces
from potluck.model.errors import DataError
from potluck.protocol.checkpoints import sha256_file

logger = logging.getLogger(__name__)

SHARD_TOKENS = 1 << 22  # 4 Mi tokens a shard (data.shard_tokens): 8 MiB at uint16, seconds on a home link
BATCH_CHARS = 1 << 24  # documents tokenized together (HF encode_batch runs them in parallel)
PIECE_CHARS = 1 << 14  # a document is encoded in newline-cut pieces of about this many characters
PROGRESS_EVERY_S = 10.0  # how often a long build says how far it is (the launch waits for it)
BYTES_EOT = 0  # the byte tokenizer's end of text: NUL, which text files do not hold
EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "<|im_end|>")
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Corpus:
    manifest: DataManifest
    blobs: Path  # the shards and the manifest, each named by its SHA-256: what the owner serves


def end_of_text(tokenizer: Tokenizer) -> int:
    """The id that separates documents: the tokenizer's end-of-text token."""
    if isinstance(tokenizer, ByteTokenizer):
        return BYTES_EOT
    if isinstance(tokenizer, HFTokenizer):
        for name in EOT_NAMES:
            if (i := tokenizer.inner.token_to_id(name)) is not None:
                return int(i)
    raise DataError(f"the tokenizer has no end-of-text token (looked for {', '.join(EOT_NAMES)})")


def _encode(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    if isinstance(tokenizer, ByteTokenizer):
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
    if isinstance(tokenizer, HFTokenizer):  # a long document in newline-cut pieces, as encode_corpus does
        cut = [list(pieces(t, PIECE_CHARS)) for t in texts]
        encoded = iter(
            tokenizer.inner.encode_batch([p for doc in cut for p in doc], add_special_tokens=False)
        )
        return [
            np.concatenate(
                [np.asarray(next(encoded).ids, dtype=np.uint32) for _ in doc] or [np.zeros(0, np.uint32)]
            )
            for doc in cut
        ]
    return [np.asarray(tokenizer.encode(t), dtype=np.uint32) for t in texts]


def _tokenize(
    files: list[Path], field: str, tokenizer: Tokenizer, eot: int, scratch: Path
) -> tuple[array, array]:
    """Pass 1: every document's ids and its end-of-text into ``scratch`` (uint32); (starts, lengths)."""
    starts, lengths = array("q"), array("q")
    at = 0
    started = said = time.monotonic()
    with scratch.open("wb") as out:
        batch: list[str] = []
        chars = 0

        def flush() -> None:
            nonlocal at, chars, said
            for ids in _encode(tokenizer, batch):
                row = np.append(ids.astype(np.uint32), np.uint32(eot))
                out.write(row.astype("<u4").tobytes())
                starts.append(at)
                lengths.append(len(row))
                at += len(row)
            batch.clear()
            chars = 0
            if (now := time.monotonic()) - said >= PROGRESS_EVERY_S:  # a large corpus takes minutes
                said = now
                rate = at / max(now - started, 1e-9)
                logger.warning("data: %d documents, %d tokens so far (%.0f tokens/s)", len(starts), at, rate)

        for text in documents(files, field):
            batch.append(text)
            chars += len(text)
            if chars >= BATCH_CHARS:
                flush()
        if batch:
            flush()
    if not starts:
        raise DataError(f"no documents with text in {files[0].parent if files else 'the data directory'}")
    return starts, lengths


def _write_shards(
    scratch: Path,
    starts: array,
    lengths: array,
    order: np.ndarray,
    dtype: str,
    shard_tokens: int,
    blobs: Path,
) -> list[Shard]:
    """Pass 2: the documents in ``order``, cut into shards of ``shard_tokens`` tokens."""
    tokens = np.memmap(scratch, dtype="<u4", mode="r")
    kind = np.dtype("<u2" if dtype == "uint16" else "<u4")
    shards: list[Shard] = []
    buffer = np.empty(shard_tokens, dtype=kind)
    fill = 0

    def emit(n: int) -> None:
        data = buffer[:n].tobytes()
        sha = hashlib.sha256(data).hexdigest()
        (blobs / sha).write_bytes(data)
        shards.append(Shard(sha, n))

    for doc in order:
        piece = tokens[starts[doc] : starts[doc] + lengths[doc]]
        while len(piece):
            take = min(len(piece), shard_tokens - fill)
            buffer[fill : fill + take] = piece[:take]
            fill += take
            piece = piece[take:]
            if fill == shard_tokens:
                emit(fill)
                fill = 0
    if fill:
        emit(fill)
    del tokens
    return shards


def cache_key(
    files: list[Path], root: Path, field: str, tokenizer_id: str, seed: int, shard_tokens: int
) -> str:
    """What decides a corpus: each file's path, size and modification time, the field, the tokenizer,
    the seed, the shard size."""
    stat = [(str(f.relative_to(root)), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    doc = [stat, field, tokenizer_id, seed, shard_tokens, 1]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:32]


def prepare_corpus(
    directory: Path,
    field: str,
    tokenizer: Tokenizer,
    tokenizer_file: Path | None,
    seed: int,
    cache: Path,
    shard_tokens: int = SHARD_TOKENS,
) -> Corpus:
    """The shipped corpus of ``directory``: from ``cache`` when built before, else built there."""
    files = source_files(directory)
    tok_id = sha256_file(tokenizer_file) if tokenizer_file is not None else "bytes"
    home = cache / cache_key(files, directory, field, tok_id, seed, shard_tokens)
    if (home / MANIFEST).is_file():
        manifest = decode_manifest((home / MANIFEST).read_bytes())
        if all((home / "blobs" / s.sha256).is_file() for s in manifest.shards):
            logger.info("data: %d tokens in %d shards, from %s", manifest.tokens, len(manifest.shards), home)
            return Corpus(manifest, home / "blobs")
    started = time.monotonic()
    work = cache / f".{home.name}.{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "blobs").mkdir(parents=True)
    try:
        eot = end_of_text(tokenizer)
        starts, lengths = _tokenize(files, field, tokenizer, eot, work / "scratch.u32")
        order = np.random.default_rng(seed).permutation(len(starts))
        dtype = "uint16" if tokenizer.vocab_size <= 1 << 16 else "uint32"
        shards = _write_shards(
            work / "scratch.u32", starts, lengths, order, dtype, shard_tokens, work / "blobs"
        )
        (work / "scratch.u32").unlink()
        manifest = DataManifest(dtype, shard_tokens, tuple(shards), len(starts), eot, tok_id, seed)
        raw = manifest.encode()
        (work / MANIFEST).write_bytes(raw)
        (work / "blobs" / manifest.fingerprint).write_bytes(raw)
        shutil.rmtree(home, ignore_errors=True)
        work.rename(home)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    logger.info(
        "data: %d documents, %d tokens in %d shards in %.2f s (%s)",
        manifest.documents,
        manifest.tokens,
        len(manifest.shards),
        time.monotonic() - started,
        home,
    )
    return Corpus(manifest, home / "blobs")
