"""Signed envelopes: how a record travels through the DHT, and the one routine that verifies it.

An envelope is a msgpack array ``[magic, swarm, name, kind, body, public_key, signature, admission]``
where ``body`` is the record's canonical JSON. The signature covers a domain tag plus
``(swarm, name, kind, DHT key id, subkey bytes, expiration, body)``, so a record cannot be replayed under
another key or subkey, into another swarm, or with a longer lifetime. ``admission`` (peer-signed
records; covered by the signature when present) is the coordinator's signed word that the signer may
take part (``admission.py``); a policy
that requires admissions refuses a peer-signed record without a valid one, and a banned signer's.

``verify`` runs cheapest checks first (size, expiration, framing) and the signature before the schema, so
garbage never reaches the JSON parser and nothing is allocated from a claimed size.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import msgpack
from pydantic import ValidationError

from potluck.protocol import identity as ident
from potluck.protocol.admission import Admission, BanList, TokenUses, owner_role
from potluck.protocol.allocation import Allocation, JobOffer
from potluck.protocol.classpar import ClassParPlan, ClassParSubnet, ClassParTeacher
from potluck.protocol.errors import AdmissionError, RecordError
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import dht_key, split_name
from potluck.protocol.records import LinkReport, PeerRecord, Record
from potluck.protocol.training import Progress, TrainPlan

RECORD_TYPES: dict[str, type[Record]] = {
    cls.KIND: cls
    for cls in (
        PeerRecord,
        LinkReport,
        JobSpec,
        TrainPlan,
        Progress,
        BanList,
        TokenUses,
        Allocation,
        JobOffer,
        ClassParPlan,
        ClassParTeacher,
        ClassParSubnet,
    )
}

MAGIC = b"PLK1"
SIGN_DOMAIN = b"potluck/record/v1\x00"
DEFAULT_MAX_VALUE_BYTES = 64 * 1024  # a PeerRecord is ~1 KiB; plans of thousands of peers fit in 64 KiB


@dataclass(frozen=True)
class TrustPolicy:
    """What a node accepts: its swarm, who may sign job-level records, and bounds."""

    swarm_id: str
    coordinator_key: bytes  # Ed25519 public key of the job's owner
    clock_skew_s: float = 60.0  # tolerated disagreement of clocks between peers, seconds
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    # Peer-signed records must carry a valid admission (every real swarm; raw test nodes may not).
    require_admission: bool = False
    # Peers whose records are refused: the coordinator's ban list as this node last read it (mutable).
    banned: set[str] = field(default_factory=set, compare=False, hash=False)


@dataclass(frozen=True)
class Verified:
    """A record that passed every check, with who signed it."""

    name: str
    subkey: Any
    record: Record
    public_key: bytes
    expiration: float

    @property
    def signer(self) -> str:
        return ident.peer_id_from_public_key(self.public_key)


def _msgpack_scalar(value: Any) -> bytes:
    """msgpack bytes of a DHT key or subkey as hivemind's serializer writes them (bin type, strict).

    Keys and subkeys are strings (peer ids, names), ints or None; tuples and other containers would go
    through hivemind's extension types, which records never use, so they are refused.
    """
    if value is not None and not isinstance(value, str | bytes | int | float):
        kind = type(value).__name__
        raise RecordError(f"a DHT key or subkey must be a string, bytes or a number, not {kind}")
    return bytes(msgpack.packb(value, use_bin_type=True, strict_types=True))


def key_id_bytes(swarm_id: str, name: str) -> bytes:
    """The bytes hivemind uses for a DHT key on the wire: SHA-1 of the msgpack-serialized key (20 B).

    Computed here so the protocol needs no hivemind; tests pin it to hivemind's ``DHTID.generate``.
    """
    return hashlib.sha1(_msgpack_scalar(dht_key(swarm_id, name))).digest()


def subkey_bytes(subkey: Any) -> bytes:
    """The bytes hivemind stores for a subkey (its msgpack serialization)."""
    return _msgpack_scalar(subkey)


def _signed_message(
    swarm: str,
    name: str,
    kind: str,
    key_id: bytes,
    subkey_b: bytes,
    expiration: float,
    body: bytes,
    admission: bytes | None = None,
) -> bytes:
    # The admission is signed with the record when there is one (no byte of the envelope goes
    # unsigned); without one the message is the 7-field envelope's, which therefore still verifies.
    fields: list[object] = [swarm, name, kind, key_id, subkey_b, float(expiration), body]
    if admission is not None:
        fields.append(admission)
    return SIGN_DOMAIN + msgpack.packb(fields, use_bin_type=True)


def seal(
    signer: ident.Identity,
    swarm_id: str,
    name: str,
    record: Record,
    expiration: float,
    subkey: Any = None,
    admission: bytes | None = None,
) -> bytes:
    """Sign ``record`` for (swarm, name, subkey) until ``expiration``; returns the envelope bytes.
    ``admission``: the signer's encoded ``Admission`` (peer-signed records of an admission swarm)."""
    _, spec = split_name(name)
    if spec.kind != record.KIND:
        raise RecordError(f"key {name!r} holds {spec.kind}, not {record.KIND}")
    body = record.canonical_bytes()
    message = _signed_message(
        swarm_id,
        name,
        record.KIND,
        key_id_bytes(swarm_id, name),
        subkey_bytes(subkey),
        expiration,
        body,
        admission,
    )
    envelope = [MAGIC, swarm_id, name, record.KIND, body, signer.public_key, signer.sign(message), admission]
    return bytes(msgpack.packb(envelope, use_bin_type=True))


def verify(
    policy: TrustPolicy, key_id: bytes, subkey_b: bytes, stored_value: bytes, expiration: float, now: float
) -> Verified:
    """Check a DHT record exactly as stored (value serialized by hivemind); raise ``RecordError`` if bad."""
    if len(stored_value) > policy.max_value_bytes:
        raise RecordError(f"oversized: {len(stored_value)} bytes > limit {policy.max_value_bytes}")
    if not isinstance(expiration, float | int) or not math.isfinite(expiration):
        raise RecordError("expiration is not a finite number")
    if expiration < now - policy.clock_skew_s:
        raise RecordError(f"stale: expired {now - expiration:.1f} s ago")

    envelope_bytes = _unpack(stored_value, policy.max_value_bytes)
    if not isinstance(envelope_bytes, bytes):
        raise RecordError("malformed: DHT value is not a byte string")
    fields = _unpack(envelope_bytes, policy.max_value_bytes)
    if not (isinstance(fields, list) and len(fields) in (7, 8)):
        raise RecordError("malformed: envelope is not a 7- or 8-element array")
    magic, swarm, name, kind, body, public_key, signature, *rest = fields
    admission = rest[0] if rest else None
    if magic != MAGIC:
        raise RecordError("malformed: bad magic (not a potluck record)")
    if not all(isinstance(x, str) for x in (swarm, name, kind)):
        raise RecordError("malformed: swarm, name and kind must be strings")
    if not all(isinstance(x, bytes) for x in (body, public_key, signature)):
        raise RecordError("malformed: body, public key and signature must be byte strings")
    if admission is not None and not isinstance(admission, bytes):
        raise RecordError("malformed: the admission must be a byte string")
    if swarm != policy.swarm_id:
        raise RecordError(f"wrong swarm: record of swarm {swarm!r}, this node serves {policy.swarm_id!r}")
    job, spec = split_name(name)
    if kind != spec.kind:
        raise RecordError(f"unknown record name/kind {name!r}/{kind!r}")
    if key_id != key_id_bytes(swarm, name):
        raise RecordError(f"key mismatch: envelope names {name!r} but is stored under another key")
    if expiration > now + spec.max_ttl_s + policy.clock_skew_s:
        raise RecordError(
            f"expiration too far in the future: {expiration - now:.0f} s > {spec.max_ttl_s:.0f} s"
        )

    message = _signed_message(swarm, name, kind, key_id, subkey_b, expiration, body, admission)
    if not ident.verify(public_key, message, signature):
        raise RecordError("bad signature: not signed by the key it carries, or altered since")

    subkey = _unpack(subkey_b, 256)
    if spec.signer == "job" and public_key != policy.coordinator_key:
        assert job is not None  # split_name: "job"-signed names are job-scoped
        check_owner(policy, ident.peer_id_from_public_key(public_key), admission, job, now)
    elif spec.signer in ("coordinator", "job"):
        if public_key != policy.coordinator_key:
            raise RecordError(f"{name} record not signed by the swarm's coordinator")
    else:
        signer_id = ident.peer_id_from_public_key(public_key)
        if subkey != signer_id:
            raise RecordError(
                "subkey is not the signer's peer id (records may only be written by their owner)"
            )
        check_member(policy, signer_id, admission, now)

    try:
        record = RECORD_TYPES[kind].model_validate_json(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise RecordError(f"schema: {kind}.{where}: {first['msg']}") from None
    if spec.signer == "subkey" and getattr(record, "peer_id", None) != subkey:
        raise RecordError(f"schema: {kind}.peer_id differs from its subkey")
    if job is not None and getattr(record, "job", getattr(record, "name", None)) != job:
        raise RecordError(f"schema: a {kind} of another job under {name!r}")
    return Verified(name, subkey, record, public_key, float(expiration))


def check_member(policy: TrustPolicy, peer_id: str, admission: Any, now: float) -> None:
    """Raise ``AdmissionError`` unless ``peer_id`` may take part: not banned and, where the policy asks
    for admissions, showing a valid one of its own (its records, its requests for state)."""
    if peer_id in policy.banned:
        raise AdmissionError(f"{peer_id} is banned from this swarm")
    if policy.require_admission:
        if admission is None:
            raise AdmissionError(f"{peer_id} shows no admission: it was never admitted")
        Admission.decode(admission).check(
            policy.swarm_id, policy.coordinator_key, peer_id, now, policy.clock_skew_s
        )


def check_owner(policy: TrustPolicy, peer_id: str, admission: Any, job: str, now: float) -> None:
    """Raise ``RecordError`` unless ``peer_id`` shows the coordinator's admission as the owner of ``job``."""
    try:
        if peer_id in policy.banned:
            raise AdmissionError(f"{peer_id} is banned from this swarm")
        if admission is None:
            raise AdmissionError("no admission")
        adm = Admission.decode(admission)
        adm.check(policy.swarm_id, policy.coordinator_key, peer_id, now, policy.clock_skew_s)
        if owner_role(job) not in adm.roles:
            raise AdmissionError(f"the admission does not name job {job!r}")
    except AdmissionError as e:
        raise RecordError(
            f"records of job {job!r} must be signed by its owner or the coordinator: {e}"
        ) from None


def _unpack(data: bytes, limit: int) -> Any:
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_bin_len=limit,
            max_str_len=limit,
            max_array_len=64,
            max_map_len=64,
            max_ext_len=0,
        )
    except Exception as e:  # msgpack raises a zoo of types on garbage
        raise RecordError(f"malformed: cannot decode msgpack ({type(e).__name__})") from None
