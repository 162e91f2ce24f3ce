"""A peer's view of a shipped corpus: one memory-mapped token file that fills as shards arrive.

The file has the corpus's full length from the start but is sparse: a shard takes disk only once
written, and pages are read through the page cache, so a corpus larger than the machine's memory
trains the same. ``have`` records the shards written and checked (their hash, before writing);
``TokenDataset`` reads the map like any token tensor, and the peer makes sure the shards a step reads
are here before it runs it (``needed``; ``peer/feed.py`` fetches them).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import torch

from potluck.model.corpus.manifest import DataManifest
from potluck.model.data import TokenDataset
from potluck.model.errors import DataError

logger = logging.getLogger(__name__)

HAVE = "have.json"
TOKENS = "tokens.bin"


class ShardedTokens:
    """The corpus of ``manifest`` under ``directory`` (this peer's cache of it)."""

    def __init__(self, manifest: DataManifest, directory: Path, seq_len: int) -> None:
        self.manifest, self.directory, self.seq_len = manifest, directory, seq_len
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / TOKENS
        size = manifest.tokens * manifest.itemsize
        if not path.exists() or path.stat().st_size != size:
            with path.open("wb") as f:  # sparse: no blocks until written
                f.truncate(size)
            (directory / HAVE).unlink(missing_ok=True)
        self.have: set[int] = self._read_have()
        kind = np.dtype("<u2" if manifest.dtype == "uint16" else "<u4")
        self._map = np.memmap(path, dtype=kind, mode="r+", shape=(manifest.tokens,))
        self.dataset = TokenDataset(torch.from_numpy(self._map), seq_len)

    def _read_have(self) -> set[int]:
        try:
            have = json.loads((self.directory / HAVE).read_text())
            return {i for i in have if isinstance(i, int) and 0 <= i < len(self.manifest.shards)}
        except (OSError, ValueError, TypeError):
            return set()

    def needed(self, first_step: int, last_step: int, per_step: int) -> list[int]:
        """The shards the sequences of steps [first_step, last_step] read (every replica's), in order,
        that this peer does not have yet."""
        n_seq, seq, size = self.dataset.n_sequences, self.seq_len, self.manifest.shard_tokens
        lo, hi = first_step * per_step, (last_step + 1) * per_step  # sequence indices [lo, hi)
        if hi - lo >= n_seq:
            runs = [(0, n_seq)]
        else:  # at most two runs: up to the end of the stream, then from its start (epochs wrap)
            a, b = lo % n_seq, (hi - 1) % n_seq + 1
            runs = [(a, b)] if a < b else [(a, n_seq), (0, b)]
        want: set[int] = set()
        for a, b in runs:  # sequence i reads tokens [i seq, i seq + seq], its targets included
            want.update(range(a * seq // size, ((b - 1) * seq + seq) // size + 1))
        return sorted(want - self.have)

    def put(self, index: int, data: bytes) -> None:
        """Write shard ``index`` after checking its bytes against the manifest; DataError if they differ."""
        shard = self.manifest.shards[index]
        if len(data) != self.manifest.shard_bytes(index) or hashlib.sha256(data).hexdigest() != shard.sha256:
            raise DataError(f"shard {index} does not match its hash in the data manifest")
        at = index * self.manifest.shard_tokens
        self._map[at : at + shard.tokens] = np.frombuffer(data, dtype=self._map.dtype)
        self._map.flush()
        self.have.add(index)
        (self.directory / HAVE).write_text(json.dumps(sorted(self.have)))

    def shard(self, index: int) -> bytes | None:
        """Shard ``index``'s bytes if this peer has it (what it serves to the others)."""
        if index not in self.have:
            return None
        at = index * self.manifest.shard_tokens
        return self._map[at : at + self.manifest.shards[index].tokens].tobytes()
