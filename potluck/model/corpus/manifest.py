"""The manifest of a shipped corpus: which token shards, in which order, of which sizes and hashes.

A JSON object, written once by the job owner (``build.py``) and named by its SHA-256, the job's
``data.fingerprint``; a peer fetches it by that hash, so a manifest it reads is the one the job was
signed with. Everything a peer allocates from it is bounded here first.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from potluck.model.errors import DataError

FORMAT = "potluck-tokens"
VERSION = 1
DTYPES = {"uint16": 2, "uint32": 4}  # bytes per token id; uint16 for vocabularies up to 65,536
MAX_MANIFEST_BYTES = 64 << 20  # ~100 B per shard: about 600k shards
MAX_SHARD_TOKENS = 1 << 26  # 64 Mi tokens (256 MiB at uint32): what one fetch holds in memory
MAX_TOKENS = 1 << 44  # a corpus of 16 Ti tokens; the sparse token file is sized from this bound
SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Shard:
    sha256: str  # of its bytes: little-endian token ids
    tokens: int


@dataclass(frozen=True)
class DataManifest:
    dtype: str
    shard_tokens: int  # tokens in every shard but the last
    shards: tuple[Shard, ...]
    documents: int
    eot: int | None  # the end-of-text id between documents (None: no separator, the built-in corpus)
    tokenizer: str  # SHA-256 of the tokenizer file the owner encoded with, or "bytes"
    seed: int  # the job seed that shuffled the documents

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    def shard_bytes(self, index: int) -> int:
        return self.shards[index].tokens * self.itemsize

    def encode(self) -> bytes:
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "dtype": self.dtype,
            "shard_tokens": self.shard_tokens,
            "documents": self.documents,
            "eot": self.eot,
            "tokenizer": self.tokenizer,
            "seed": self.seed,
            "shards": [[s.sha256, s.tokens] for s in self.shards],
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.encode()).hexdigest()


def decode_manifest(raw: bytes, fingerprint: str | None = None) -> DataManifest:
    """Parse and bound a manifest; with ``fingerprint``, its SHA-256 must be that. DataError on anything
    else, naming what is wrong."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise DataError(f"data manifest of {len(raw)} bytes, over {MAX_MANIFEST_BYTES}")
    if fingerprint is not None and hashlib.sha256(raw).hexdigest() != fingerprint:
        raise DataError(f"data manifest does not hash to the job's data.fingerprint {fingerprint[:12]}")
    try:
        doc: Any = json.loads(raw)
        if doc["format"] != FORMAT or doc["version"] != VERSION:
            raise DataError(f"not a {FORMAT} v{VERSION} manifest")
        shards = tuple(Shard(str(h), int(n)) for h, n in doc["shards"])
        m = DataManifest(
            dtype=str(doc["dtype"]),
            shard_tokens=int(doc["shard_tokens"]),
            shards=shards,
            documents=int(doc["documents"]),
            eot=None if doc["eot"] is None else int(doc["eot"]),
            tokenizer=str(doc["tokenizer"]),
            seed=int(doc["seed"]),
        )
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise DataError(f"malformed data manifest: {e}") from None
    if m.dtype not in DTYPES or not 0 < m.shard_tokens <= MAX_SHARD_TOKENS or not m.shards:
        raise DataError("data manifest: dtype uint16 or uint32, shard_tokens in (0, 2^26], shards non-empty")
    last = len(m.shards) - 1
    for i, s in enumerate(m.shards):
        full = s.tokens == m.shard_tokens
        if not SHA256.match(s.sha256) or not (full or (i == last and 0 < s.tokens < m.shard_tokens)):
            raise DataError(f"data manifest: shard {i} has a bad hash or size")
    if m.tokens > MAX_TOKENS:
        raise DataError(f"data manifest: {m.tokens} tokens, over {MAX_TOKENS}")
    return m
