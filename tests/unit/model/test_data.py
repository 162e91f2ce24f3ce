import importlib.util
import json
import sys

import pytest
import torch

from potluck.model import data
from potluck.model.data import (
    ByteTokenizer,
    DataError,
    HFTokenizer,
    TokenDataset,
    encode_corpus,
    generated_corpus,
    load_dataset,
    load_tokenizer,
    read_text_dir,
)
from potluck.protocol.jobspec import DataSpec
from tests.helpers.bpe import train_bpe


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


# --- tokens as tensors ------------------------------------------------------------------------------


def test_byte_fast_path_matches_encode_and_is_compact():
    tok = ByteTokenizer()
    text = "potluck: ünïcode ✓\n" * 50
    ids = encode_corpus(tok, text)
    assert ids.dtype == torch.uint8 and ids.tolist() == tok.encode(text)
    assert len(encode_corpus(tok, "")) == 0


def test_tensor_and_list_datasets_give_the_same_int64_batches():
    tok = ByteTokenizer()
    text = generated_corpus(5_000, seed=2)
    from_list = TokenDataset(tok.encode(text), seq_len=16)
    from_tensor = TokenDataset(encode_corpus(tok, text), seq_len=16)
    assert from_tensor.tokens.dtype == torch.uint8 and from_tensor.n_sequences == from_list.n_sequences
    for step in (0, 3, 10_000):  # the last wraps around
        a, b = from_list.replica_batch(step, 1, 2, 8), from_tensor.replica_batch(step, 1, 2, 8)
        assert b.dtype == torch.long and torch.equal(a, b)
    with pytest.raises(DataError, match="1-D integer tensor"):
        TokenDataset(torch.zeros(4, 40, dtype=torch.long), seq_len=16)
    with pytest.raises(DataError, match="1-D integer tensor"):
        TokenDataset(torch.zeros(100), seq_len=16)
    with pytest.raises(DataError, match="fewer than one sequence"):
        TokenDataset(torch.arange(10), seq_len=16)


# --- parquet --------------------------------------------------------------------------------------


def test_parquet_text_column_is_read_in_path_order(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    (tmp_path / "a.txt").write_text("first")
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["x", None, "y z"]}), tmp_path / "b.parquet")
    sub = tmp_path / "c"
    sub.mkdir()
    nested = pa.array([{"k": 1, "v": "s"}])
    pq.write_table(
        pa.table({"meta": nested, "text": pa.array(["deep"], pa.large_string())}), sub / "d.parquet"
    )
    assert read_text_dir(tmp_path) == "first\nx\ny z\ndeep"


def test_parquet_errors_name_the_file(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(pa.table({"body": ["a"], "lang": ["en"]}), bad / "t.parquet")
    with pytest.raises(DataError, match=r"t\.parquet has no 'text' column \(its columns: body, lang\)"):
        read_text_dir(bad)
    ints = tmp_path / "ints"
    ints.mkdir()
    pq.write_table(pa.table({"text": [1, 2]}), ints / "n.parquet")
    with pytest.raises(DataError, match=r"n\.parquet: column 'text' holds int64, expected strings"):
        read_text_dir(ints)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "j.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"j\.parquet is not a readable parquet file"):
        read_text_dir(junk)
    big = tmp_path / "big"
    big.mkdir()
    # Both files compress far below the cap on disk, but the cap is on the text they expand to: the
    # first by its page sizes, the second (one string stored once in a dictionary) only once read.
    table = pa.table({"text": ["a" * 10_000] * 10})
    pq.write_table(table, big / "y.parquet", compression="zstd", use_dictionary=False)
    assert (big / "y.parquet").stat().st_size < 20_000
    monkeypatch.setattr(data, "MAX_FILE_BYTES", 20_000)
    with pytest.raises(DataError, match=r"y\.parquet: column 'text' is \d+ bytes uncompressed, over 20000"):
        read_text_dir(big)
    (big / "y.parquet").unlink()
    pq.write_table(table, big / "z.parquet", compression="zstd")
    assert pq.ParquetFile(big / "z.parquet").metadata.row_group(0).column(0).total_uncompressed_size < 20_000
    with pytest.raises(DataError, match=r"z\.parquet: column 'text' is \d+ bytes uncompressed, over 20000"):
        read_text_dir(big)
    monkeypatch.setattr(data, "MAX_FILE_BYTES", 100)
    with pytest.raises(DataError, match=r"z\.parquet is larger than 100 bytes"):
        read_text_dir(big)


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow` raise ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(
        DataError, match=r"t\.parquet needs the 'pyarrow' package: pip install 'potluck\[data\]'"
    ):
        read_text_dir(tmp_path)


def test_empty_directory_lists_every_suffix(tmp_path):
    with pytest.raises(DataError, match=r"holds no \.txt or \.jsonl or \.parquet files"):
        read_text_dir(tmp_path)


# --- tokenizers -------------------------------------------------------------------------------------


def test_load_tokenizer_bytes_and_hugging_face_file(tmp_path, monkeypatch):
    assert isinstance(load_tokenizer(None), ByteTokenizer)
    tok = load_tokenizer(str(train_bpe(tmp_path)))
    assert isinstance(tok, HFTokenizer) and 256 < tok.vocab_size <= 300
    text = "ada adds 3 and 4 to get 7.\nünïcode ✓<eos>"
    ids = tok.encode(text)
    assert tok.decode(ids) == text and max(ids) < tok.vocab_size
    assert len(ids) < len(text.encode())  # merges were learned
    # Piecewise corpus encoding is what encode gives when lines end in a single newline.
    corpus = generated_corpus(3_000, seed=9)
    monkeypatch.setattr(data, "_PIECE_CHARS", 100)
    monkeypatch.setattr(data, "_PIECES_PER_BATCH", 4)
    ids_tensor = encode_corpus(tok, corpus)
    assert ids_tensor.dtype == torch.int32 and ids_tensor.tolist() == tok.encode(corpus)
    assert len(encode_corpus(tok, "")) == 0


def test_any_tokenizer_protocol_works_through_the_generic_path():
    class Letters:
        vocab_size = 27

        def encode(self, text: str) -> list[int]:
            return [ord(c) - 96 if c.isalpha() else 0 for c in text.lower()]

        def decode(self, ids: list[int]) -> str:
            return "".join(chr(i + 96) if i else " " for i in ids)

    ids = encode_corpus(Letters(), "ab c")
    assert ids.dtype == torch.long and ids.tolist() == [1, 2, 0, 3]


def test_pieces_cut_after_newlines_and_rejoin():
    text = "abc\ndefgh\n" + "x" * 25 + "\nend"
    pieces = list(data.pieces(text, 8))
    assert "".join(pieces) == text
    assert pieces[:2] == ["abc\n", "defgh\n"] and all(len(p) <= 8 for p in pieces)


def test_load_tokenizer_errors_name_the_path(tmp_path, monkeypatch):
    with pytest.raises(DataError, match=r"tokenizer file .*nope\.json does not exist"):
        load_tokenizer(str(tmp_path / "nope.json"))
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    if importlib.util.find_spec("tokenizers") is not None:
        with pytest.raises(DataError, match=r"garbage\.json is not a Hugging Face tokenizers JSON file"):
            load_tokenizer(str(garbage))
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(
        DataError, match=r"garbage\.json needs the 'tokenizers' package: pip install 'potluck\[data\]'"
    ):
        load_tokenizer(str(garbage))


# --- load_dataset -----------------------------------------------------------------------------------


def test_load_dataset_generated_is_the_seeded_corpus_in_bytes():
    ds, tok = load_dataset(DataSpec(generated_chars=4_096), seq_len=32, vocab_size=256, seed=7)
    assert isinstance(tok, ByteTokenizer)
    assert ds.tokens.tolist() == list(generated_corpus(4_096, 7).encode())
    again, _ = load_dataset(DataSpec(generated_chars=4_096), seq_len=32, vocab_size=256, seed=7)
    assert torch.equal(ds.replica_batch(3, 0, 2, 4), again.replica_batch(3, 0, 2, 4))
    with pytest.raises(DataError, match=r"^tokenizer has 256 tokens but model\.vocab_size is 100$"):
        load_dataset(DataSpec(), seq_len=32, vocab_size=100, seed=7)


def test_load_dataset_directory_with_hugging_face_tokenizer(tmp_path, monkeypatch):
    file = train_bpe(tmp_path)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text(generated_corpus(2_000, seed=1))
    monkeypatch.setenv("HOME", str(tmp_path))  # "~" in data.path and data.tokenizer expands to it
    spec = DataSpec(source="directory", path="~/corpus", tokenizer="~/tokenizer.json")
    ds, tok = load_dataset(spec, seq_len=16, vocab_size=512, seed=0)
    assert isinstance(tok, HFTokenizer) and tok.path == file
    assert ds.tokens.tolist() == tok.encode(read_text_dir(corpus))
    assert ds.replica_batch(0, 0, 1, 2).dtype == torch.long
    with pytest.raises(
        DataError, match=rf"^tokenizer has {tok.vocab_size} tokens but model\.vocab_size is 256$"
    ):
        load_dataset(spec, seq_len=16, vocab_size=256, seed=0)


def test_load_dataset_missing_directory_names_it(tmp_path):
    spec = DataSpec(source="directory", path=str(tmp_path / "absent"))
    with pytest.raises(DataError, match=r"dataset directory .*absent does not exist"):
        load_dataset(spec, seq_len=16, vocab_size=256, seed=0)
