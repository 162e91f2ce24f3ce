"""The signed state manifest: signatures bind it to the holder's id, hashes to its bytes, limits to its claims."""

import hashlib
import json

import pytest

from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.errors import IdentityError
from potluck.protocol.identity import Identity, public_key_from_peer_id
from potluck.protocol.jobspec import ModelSpec
from potluck.transfer.errors import TransferError
from potluck.transfer.manifest import (
    DOMAIN,
    StateManifest,
    StateWant,
    TensorEntry,
    check_chunk,
    check_want,
    chunk_hashes,
    parse,
)

MODEL = ModelSpec(n_layers=4, d_model=32, n_heads=2, vocab_size=256, seq_len=16)
BUDGET = 1 << 30


def meta(step: int = 7) -> StageMeta:
    return StageMeta(
        job="j",
        step=step,
        stage=0,
        n_stages=2,
        first_layer=0,
        last_layer=2,
        model=MODEL,
        seed=3,
        tokenizer=None,
        epoch=1,
    )


def manifest(holder: Identity, data: bytes = bytes(range(256)) * 40, chunk: int = 4096) -> StateManifest:
    entries = (TensorEntry("model.layers.0.w", "float32", (len(data) // 4,)),)
    return StateManifest(holder.peer_id, meta(), 0, 2, chunk, entries, chunk_hashes(data, chunk))


def resign(holder: Identity, doc: dict) -> bytes:
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return holder.sign(DOMAIN + body) + body


def test_a_signed_manifest_parses_back_equal():
    holder = Identity.generate()
    m = manifest(holder)
    assert parse(m.signed(holder), holder.peer_id, BUDGET) == m
    assert m.total_bytes == 10240 and len(m.chunks) == 3 and m.chunk_span(2) == (8192, 10240)


def test_public_key_comes_out_of_the_peer_id():
    holder = Identity.generate()
    assert public_key_from_peer_id(holder.peer_id) == holder.public_key
    with pytest.raises(IdentityError):
        public_key_from_peer_id("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N")  # an RSA-style (sha256) id


def test_forged_or_misattributed_manifests_are_refused():
    holder, other = Identity.generate(), Identity.generate()
    payload = manifest(holder).signed(holder)
    with pytest.raises(TransferError, match="signature"):
        parse(payload, other.peer_id, BUDGET)  # served by someone else
    tampered = payload[:64] + payload[64:].replace(b'"step":7', b'"step":8')
    with pytest.raises(TransferError, match="signature"):
        parse(tampered, holder.peer_id, BUDGET)
    doc = json.loads(payload[64:])
    doc["holder"] = holder.peer_id
    with pytest.raises(TransferError, match="holder"):  # signed by other, naming holder: not for this stream
        body = json.dumps({**doc, "holder": holder.peer_id}).encode()
        parse(other.sign(DOMAIN + body) + body, other.peer_id, BUDGET)
    with pytest.raises(ValueError):
        manifest(holder).signed(other)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"tensors": [["w", "float32", [1 << 40]]]}, "bad shape"),  # one size over the budget
        ({"tensors": [["w", "float32", [1 << 20, 1 << 20]]]}, "bytes this fetch may allocate"),
        ({"tensors": [["w", "complex64", [4]]]}, "dtype"),
        ({"tensors": [["w", "float32", [-1]]]}, "shape"),
        ({"tensors": [["w", "float32", [1] * 9]]}, "shape"),
        ({"chunk_bytes": 1 << 30}, "chunk_bytes"),
        ({"chunks": ["00" * 32]}, "chunk hashes"),
        ({"first": 3}, "first"),
        ({"version": 2}, "version"),
    ],
)
def test_oversized_or_inconsistent_claims_are_refused_before_allocation(change, match):
    holder = Identity.generate()
    doc = {**json.loads(manifest(holder).signed(holder)[64:]), **change}
    with pytest.raises(TransferError, match=match):
        parse(resign(holder, doc), holder.peer_id, BUDGET)


def test_a_chunk_is_used_only_when_size_and_hash_match():
    holder = Identity.generate()
    data = bytes(range(256)) * 40
    m = manifest(holder, data)
    check_chunk(m, 1, data[4096:8192])
    check_chunk(m, 2, data[8192:])
    bad = bytearray(data[4096:8192])
    bad[100] ^= 1
    with pytest.raises(TransferError, match="SHA-256"):
        check_chunk(m, 1, bytes(bad))
    with pytest.raises(TransferError, match="bytes"):
        check_chunk(m, 2, data[8192:] + b"x")
    assert m.chunks[0] == hashlib.sha256(data[:4096]).hexdigest()


def test_the_manifest_must_be_the_state_asked_for():
    holder = Identity.generate()
    m = manifest(holder)
    check_want(m, StateWant("j", MODEL, 3, 7, 0, 2))
    with pytest.raises(TransferError, match="step 7, asked 8"):
        check_want(m, StateWant("j", MODEL, 3, 8, 0, 2))
    with pytest.raises(TransferError, match="job"):
        check_want(m, StateWant("k", MODEL, 3, 7, 0, 2))
    with pytest.raises(TransferError, match="layers"):
        check_want(m, StateWant("j", MODEL, 3, 7, 1, 2))
