"""A peer's token file: sparse until shards arrive, each checked against its hash, read as the
training stream the owner built."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from potluck.model.corpus.build import prepare_corpus
from potluck.model.corpus.tokens import TOKENS, ShardedTokens
from potluck.model.data import ByteTokenizer
from potluck.model.errors import DataError


def corpus(tmp: Path, shard_tokens: int = 4096):
    (tmp / "data").mkdir(parents=True)
    for i in range(30):
        (tmp / "data" / f"{i:02d}.txt").write_text(f"text {i} " * 200)
    return prepare_corpus(
        tmp / "data", "text", ByteTokenizer(), None, 3, tmp / "cache", shard_tokens=shard_tokens
    )


def test_shards_fill_a_sparse_file_that_reads_as_the_owners_stream(tmp_path: Path) -> None:
    c = corpus(tmp_path)
    m = c.manifest
    tokens = ShardedTokens(m, tmp_path / "peer", seq_len=64)
    assert (tmp_path / "peer" / TOKENS).stat().st_size == m.tokens * 2
    assert (tmp_path / "peer" / TOKENS).stat().st_blocks * 512 < m.tokens  # sparse: no shard on disk yet
    per_step = 8  # sequences a step
    assert tokens.needed(0, 0, per_step) == [0]  # 8 x 64 + 1 tokens: inside the first shard
    wanted = tokens.needed(0, 10, per_step)
    assert wanted == list(range(wanted[-1] + 1)) and len(wanted) > 1
    with pytest.raises(DataError, match="does not match its hash"):
        tokens.put(0, (c.blobs / m.shards[1].sha256).read_bytes())
    for i in range(len(m.shards)):
        tokens.put(i, (c.blobs / m.shards[i].sha256).read_bytes())
    assert tokens.needed(0, 10_000, per_step) == []
    owner = np.concatenate([np.frombuffer((c.blobs / s.sha256).read_bytes(), dtype="<u2") for s in m.shards])
    batch = tokens.dataset.replica_batch(5, 1, 2, per_step)
    expect = torch.stack(
        [torch.from_numpy(owner[i * 64 : i * 64 + 65].astype(np.int64)) for i in range(41, 48, 2)]
    )
    assert torch.equal(batch, expect)
    assert tokens.shard(2) == (c.blobs / m.shards[2].sha256).read_bytes()
    # a restarted peer finds what it fetched
    again = ShardedTokens(m, tmp_path / "peer", seq_len=64)
    assert again.have == set(range(len(m.shards)))


def test_the_stream_wraps_around_like_any_token_dataset(tmp_path: Path) -> None:
    c = corpus(tmp_path)
    tokens = ShardedTokens(c.manifest, tmp_path / "peer", seq_len=64)
    n = tokens.dataset.n_sequences
    step = n // 8 + 1  # past the end: sequences wrap to the start
    assert 0 in tokens.needed(step, step, 8)
