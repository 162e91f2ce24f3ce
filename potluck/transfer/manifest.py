"""The signed manifest of a live state transfer, and the checks every received byte passes.

A holder serves the tensors of layers [first, last) as ONE byte stream: the tensors in manifest order,
each its raw little-endian bytes, cut into chunks of ``chunk_bytes`` (the last one shorter). The manifest
lists per tensor its name, dtype and shape (offsets follow from the order), per chunk its SHA-256, and
the holder's ``StageMeta`` (job, model, seed, step, its layers). One stream rather than chunks per tensor
keeps the many tiny tensors (norm weights, AdamW step counts) from costing a chunk each.

The manifest is canonical JSON, signed with the holder's Ed25519 identity under a domain prefix. A
potluck peer id inlines its Ed25519 public key, so a fetcher verifies the signature against the id it
opened the stream to, with no key exchange. Every claimed size is checked against limits and the
fetcher's budget before anything is allocated; ``parse`` raises ``TransferError`` naming the fault.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass

from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.errors import CheckpointError, IdentityError
from potluck.protocol.identity import SIGNATURE_BYTES, Identity, public_key_from_peer_id, verify
from potluck.protocol.jobspec import ModelSpec
from potluck.protocol.records import canonical_json
from potluck.protocol.wire import MAX_STATE_CHUNK_BYTES
from potluck.transfer.errors import TransferError

FORMAT = "potluck-state-manifest"
VERSION = 1
DOMAIN = b"potluck-state-manifest/1\x00"  # signatures over manifests can never pass as another record's
CHUNK_BYTES = 1 << 20  # 1 MiB: small enough to re-request cheaply, large enough that framing is noise
MAX_TENSORS = 1 << 16  # a stage of 1024 layers has ~40k tensors (weights, two moments, step counts)
MAX_NAME_CHARS = 256
MAX_DIMS = 8
# Bytes per element of every dtype a stage state may hold (names as torch prints them, without "torch.").
ITEMSIZE = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class StateWant:
    """What a fetcher asks for: layers [first, last) of ``job`` after ``step`` steps."""

    job: str
    model: ModelSpec
    seed: int
    step: int
    first: int
    last: int

    def __post_init__(self) -> None:
        if not 0 <= self.first < self.last <= self.model.n_layers or self.step < 0:
            raise ValueError(f"layers [{self.first}, {self.last}) at step {self.step} not in the model")


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str  # a key of ITEMSIZE
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class StateManifest:
    holder: str  # the serving peer's id; the signature verifies under the key it inlines
    meta: StageMeta  # the holder's stage: job, model, seed, step, its layers, plan epoch
    first: int  # the layers served, [first, last): inside the holder's
    last: int
    chunk_bytes: int
    tensors: tuple[TensorEntry, ...]
    chunks: tuple[str, ...]  # SHA-256 (hex) of each chunk of the byte stream

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def chunk_span(self, index: int) -> tuple[int, int]:
        """[start, end) of chunk ``index`` in the byte stream."""
        start = index * self.chunk_bytes
        return start, min(start + self.chunk_bytes, self.total_bytes)

    def data(self) -> dict[str, object]:
        """The bytes served and their layout: equal for every holder of the same state of these layers
        (the meta may differ in stage index or plan epoch, which the fetcher checks on its own)."""
        return {
            "first": self.first,
            "last": self.last,
            "chunk_bytes": self.chunk_bytes,
            "tensors": [[t.name, t.dtype, list(t.shape)] for t in self.tensors],
            "chunks": list(self.chunks),
        }

    def body(self) -> bytes:
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "holder": self.holder,
            "meta": self.meta.to_dict(),
            **self.data(),
        }
        return canonical_json(doc)

    def signed(self, identity: Identity) -> bytes:
        """The STATE_MANIFEST payload: signature || body."""
        if identity.peer_id != self.holder:
            raise ValueError(f"identity {identity.peer_id} cannot sign for holder {self.holder}")
        body = self.body()
        return identity.sign(DOMAIN + body) + body


def chunk_hashes(data: memoryview | bytes, chunk_bytes: int) -> tuple[str, ...]:
    return tuple(
        hashlib.sha256(data[i : i + chunk_bytes]).hexdigest() for i in range(0, len(data), chunk_bytes)
    )


def check_chunk(manifest: StateManifest, index: int, data: bytes) -> None:
    """``TransferError`` unless ``data`` is exactly chunk ``index``: its size and SHA-256."""
    start, end = manifest.chunk_span(index)
    if len(data) != end - start:
        raise TransferError(
            f"chunk {index} from {manifest.holder}: {len(data)} bytes, expected {end - start}"
        )
    if hashlib.sha256(data).hexdigest() != manifest.chunks[index]:
        raise TransferError(f"chunk {index} from {manifest.holder}: SHA-256 does not match the manifest")


def parse(payload: bytes, holder: str, max_bytes: int) -> StateManifest:
    """Verify and parse a STATE_MANIFEST payload from ``holder``, refusing states over ``max_bytes``."""
    try:
        key = public_key_from_peer_id(holder)
    except IdentityError as e:
        raise TransferError(str(e)) from None
    sig, body = payload[:SIGNATURE_BYTES], payload[SIGNATURE_BYTES:]
    if not verify(key, DOMAIN + body, sig):  # before parsing: a forgery costs one verification
        raise TransferError(f"manifest from {holder}: signature does not verify under its peer id")
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TransferError(f"manifest from {holder} is not JSON: {e}") from None
    try:
        return _from_doc(doc, holder, max_bytes)
    except (KeyError, TypeError, ValueError, CheckpointError) as e:
        raise TransferError(f"manifest from {holder}: {e}") from None


def _int(doc: dict[str, object], key: str, low: int, high: int) -> int:
    value = doc[key]
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"`{key}` must be an integer in [{low}, {high}], got {value!r}")
    return value


def _from_doc(doc: object, holder: str, max_bytes: int) -> StateManifest:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise ValueError(f"not a {FORMAT} version {VERSION} manifest")
    if doc.get("holder") != holder:
        raise ValueError(f"signed for holder {doc.get('holder')!r}, the stream is from {holder}")
    meta = StageMeta.from_dict(doc["meta"], f"manifest from {holder}")
    first = _int(doc, "first", meta.first_layer, meta.last_layer - 1)
    last = _int(doc, "last", first + 1, meta.last_layer)
    chunk_bytes = _int(doc, "chunk_bytes", 1, MAX_STATE_CHUNK_BYTES)
    raw_tensors, raw_chunks = doc["tensors"], doc["chunks"]
    if not isinstance(raw_tensors, list) or len(raw_tensors) > MAX_TENSORS:
        raise ValueError(f"`tensors` must be a list of at most {MAX_TENSORS}")
    tensors: list[TensorEntry] = []
    total = 0
    for item in raw_tensors:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)):
            raise ValueError("a tensor entry must be [name, dtype, shape]")
        name, dtype, shape = item
        if not 0 < len(name) <= MAX_NAME_CHARS or dtype not in ITEMSIZE:
            raise ValueError(f"tensor {name[:MAX_NAME_CHARS]!r}: bad name or dtype {dtype!r}")
        if not isinstance(shape, list) or len(shape) > MAX_DIMS:
            raise ValueError(f"tensor {name!r}: shape must be a list of at most {MAX_DIMS} sizes")
        if any(not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= max_bytes for n in shape):
            raise ValueError(f"tensor {name!r}: bad shape {shape!r}")
        entry = TensorEntry(name, dtype, tuple(shape))
        total += entry.nbytes  # Python ints: a hostile shape cannot overflow
        if total > max_bytes:
            raise ValueError(f"claims more than the {max_bytes} bytes this fetch may allocate")
        tensors.append(entry)
    if len({t.name for t in tensors}) != len(tensors):
        raise ValueError("tensor names repeat")
    expected = math.ceil(total / chunk_bytes)
    if not isinstance(raw_chunks, list) or len(raw_chunks) != expected:
        raise ValueError(f"{total} bytes in chunks of {chunk_bytes} need {expected} chunk hashes")
    if not all(isinstance(h, str) and _SHA256.fullmatch(h) for h in raw_chunks):
        raise ValueError("chunk hashes must be lowercase hex SHA-256")
    return StateManifest(holder, meta, first, last, chunk_bytes, tuple(tensors), tuple(raw_chunks))


def check_want(manifest: StateManifest, want: StateWant) -> None:
    """``TransferError`` unless the manifest is the state asked for: job, model, seed, step, layers."""
    meta = manifest.meta
    faults = [
        f"{what} {got!r}, asked {asked!r}"
        for what, got, asked in (
            ("job", meta.job, want.job),
            ("step", meta.step, want.step),
            ("seed", meta.seed, want.seed),
            ("layers", (manifest.first, manifest.last), (want.first, want.last)),
        )
        if got != asked
    ]
    if meta.model != want.model:
        faults.append("a different model shape")
    if faults:
        raise TransferError(
            f"manifest from {manifest.holder} is not the state asked for: {'; '.join(faults)}"
        )
