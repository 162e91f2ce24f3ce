"""A shipped corpus built on the owner's machine: every source kind, documents separated by the
end-of-text id and shuffled by the job seed, content-addressed shards, a cache a relaunch reuses."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from potluck.model.corpus.build import BYTES_EOT, MANIFEST, prepare_corpus
from potluck.model.corpus.manifest import DataManifest, Shard, decode_manifest
from potluck.model.data import ByteTokenizer, load_tokenizer
from potluck.model.errors import DataError
from potluck.protocol.checkpoints import sha256_file
from tests.helpers.bpe import train_bpe

DOCS = [f"document number {i}: " + "x" * (i % 7) for i in range(40)]


def write_sources(root: Path) -> list[str]:
    """DOCS spread over a .txt, a .jsonl, a .parquet and a DatasetDict written by ``datasets``
    (its train split; its test split is held out); returns them in file order."""
    pa = pytest.importorskip("pyarrow")
    datasets = pytest.importorskip("datasets")
    import pyarrow.parquet as pq

    root.mkdir(parents=True)
    (root / "a.txt").write_text(DOCS[0])
    lines = [json.dumps({"text": d, "id": i}) for i, d in enumerate(DOCS[1:15])]
    (root / "b.jsonl").write_text("\n".join(lines) + "\n\n")
    pq.write_table(pa.table({"text": DOCS[15:30]}), root / "c.parquet")
    splits = {
        "train": datasets.Dataset.from_dict({"text": DOCS[30:], "n": list(range(10))}),
        "test": datasets.Dataset.from_dict({"text": ["held out"], "n": [0]}),
    }
    datasets.DatasetDict(splits).save_to_disk(str(root / "d"))
    return DOCS


def stream(corpus_blobs: Path, manifest_raw: bytes) -> np.ndarray:
    m = decode_manifest(manifest_raw)
    return np.concatenate(
        [np.frombuffer((corpus_blobs / s.sha256).read_bytes(), dtype="<u2") for s in m.shards]
    )


def split_documents(tokens: np.ndarray, eot: int) -> list[str]:
    cuts = np.flatnonzero(tokens == eot)
    docs, start = [], 0
    for c in cuts:
        docs.append(bytes(tokens[start:c].astype(np.uint8)).decode())
        start = c + 1
    assert start == len(tokens), "the stream ends with an end-of-text"
    return docs


def test_every_document_once_shuffled_by_the_seed(tmp_path: Path) -> None:
    docs = write_sources(tmp_path / "data")
    a = prepare_corpus(
        tmp_path / "data", "text", ByteTokenizer(), None, 1, tmp_path / "cache", shard_tokens=64
    )
    raw = (a.blobs / a.manifest.fingerprint).read_bytes()
    assert hashlib.sha256(raw).hexdigest() == a.manifest.fingerprint
    assert len(a.manifest.shards) > 3 and all(s.tokens == 64 for s in a.manifest.shards[:-1])
    order = split_documents(stream(a.blobs, raw), BYTES_EOT)
    assert sorted(order) == sorted(docs) and order != docs  # all of them, not in file order
    b = prepare_corpus(
        tmp_path / "data", "text", ByteTokenizer(), None, 2, tmp_path / "cache", shard_tokens=64
    )
    again = split_documents(stream(b.blobs, (b.blobs / b.manifest.fingerprint).read_bytes()), BYTES_EOT)
    assert sorted(again) == sorted(docs) and again != order  # another seed, another order
    assert b.manifest.fingerprint != a.manifest.fingerprint


def test_a_relaunch_reuses_the_corpus_and_a_changed_file_rebuilds_it(tmp_path: Path) -> None:
    write_sources(tmp_path / "data")
    first = prepare_corpus(tmp_path / "data", "text", ByteTokenizer(), None, 0, tmp_path / "cache")
    stamp = (first.blobs.parent / MANIFEST).stat().st_mtime_ns
    again = prepare_corpus(tmp_path / "data", "text", ByteTokenizer(), None, 0, tmp_path / "cache")
    assert again.manifest == first.manifest and (again.blobs.parent / MANIFEST).stat().st_mtime_ns == stamp
    (tmp_path / "data" / "a.txt").write_text("a different first document")
    changed = prepare_corpus(tmp_path / "data", "text", ByteTokenizer(), None, 0, tmp_path / "cache")
    assert changed.manifest.fingerprint != first.manifest.fingerprint


def test_bad_sources_are_named(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    with pytest.raises(DataError, match="holds no"):
        prepare_corpus(tmp_path / "data", "text", ByteTokenizer(), None, 0, tmp_path / "cache")
    (tmp_path / "data" / "x.jsonl").write_text('{"body": "no text field"}\n')
    with pytest.raises(DataError, match=r"x\.jsonl:1: expected a JSON object with a 'text' field"):
        prepare_corpus(tmp_path / "data", "text", ByteTokenizer(), None, 0, tmp_path / "cache")
    assert (
        prepare_corpus(
            tmp_path / "data", "body", ByteTokenizer(), None, 0, tmp_path / "cache"
        ).manifest.documents
        == 1
    )


def test_a_forged_or_oversized_manifest_is_refused() -> None:
    m = DataManifest("uint16", 8, (Shard("a" * 64, 8), Shard("b" * 64, 3)), 2, 0, "bytes", 0)
    assert decode_manifest(m.encode(), m.fingerprint) == m
    with pytest.raises(DataError, match="does not hash"):
        decode_manifest(m.encode(), "0" * 64)
    bad = DataManifest("uint16", 8, (Shard("a" * 64, 3), Shard("b" * 64, 8)), 2, 0, "bytes", 0)
    with pytest.raises(DataError, match="shard 0"):
        decode_manifest(bad.encode())
    with pytest.raises(DataError, match="over"):
        decode_manifest(b" " * (64 << 20 | 1))
    with pytest.raises(DataError, match="malformed"):
        decode_manifest(b'{"format": "potluck-tokens"}')


def test_a_hugging_face_tokenizer_separates_documents_with_its_end_of_text(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(str(train_bpe(tmp_path)))
    docs = write_sources(tmp_path / "data")
    file = tmp_path / "tokenizer.json"
    c = prepare_corpus(tmp_path / "data", "text", tokenizer, file, 5, tmp_path / "cache", shard_tokens=128)
    eot = c.manifest.eot
    assert eot == tokenizer.inner.token_to_id("<eos>") and c.manifest.tokenizer == sha256_file(file)
    tokens = stream(c.blobs, (c.blobs / c.manifest.fingerprint).read_bytes())
    cuts = np.flatnonzero(tokens == eot)
    pieces = np.split(tokens, cuts + 1)[:-1]
    assert sorted(tokenizer.decode(p[:-1].tolist()) for p in pieces) == sorted(docs)
