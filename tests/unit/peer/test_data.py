import json

import pytest
import torch

from potluck.peer.data import ByteTokenizer, DataError, TokenDataset, generated_corpus, read_text_dir


def test_byte_tokenizer_roundtrip():
    tok = ByteTokenizer()
    text = "potluck: ünïcode ✓"
    assert tok.decode(tok.encode(text)) == text
    assert max(tok.encode(text)) < 256


def test_replicas_get_disjoint_shards_whose_union_is_the_global_batch():
    tok = ByteTokenizer()
    ds = TokenDataset(tok.encode(generated_corpus(20_000, seed=1)), seq_len=16)
    per_step, replicas = 12, 3
    for step in (0, 5):
        shards = [ds.replica_batch(step, r, replicas, per_step) for r in range(replicas)]
        assert all(s.shape == (per_step // replicas, 17) for s in shards)
        rows = {tuple(row.tolist()) for s in shards for row in s}
        whole = {tuple(ds.sequence(i).tolist()) for i in range(step * per_step, (step + 1) * per_step)}
        assert rows == whole and len(rows) == per_step
    # recomputable from (step, replica, R) alone
    assert torch.equal(ds.replica_batch(5, 1, 3, 12), ds.replica_batch(5, 1, 3, 12))
    inputs, targets = next(ds.micro_batches(ds.replica_batch(0, 0, 1, 4), 2))
    assert inputs.shape == (2, 16) and torch.equal(inputs[:, 1:], targets[:, :-1])


def test_generated_corpus_is_deterministic():
    assert generated_corpus(500, 3) == generated_corpus(500, 3)
    assert generated_corpus(500, 3) != generated_corpus(500, 4)
    assert len(generated_corpus(500, 3)) == 500


def test_text_directory_and_errors(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "world"}) + "\n\n")
    assert read_text_dir(tmp_path) == "hello\nworld"
    (tmp_path / "c.jsonl").write_text('{"nope": 1}\n')
    with pytest.raises(DataError, match=r"c\.jsonl:1"):
        read_text_dir(tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        read_text_dir(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match=r"no \.txt or \.jsonl"):
        read_text_dir(empty)
    with pytest.raises(DataError, match="fewer than one sequence"):
        TokenDataset([1, 2, 3], seq_len=16)
