"""Every class of bad record is refused by the same routine the DHT validator runs."""

import msgpack
import pytest
from hivemind.utils.serializer import MSGPackSerializer
from hypothesis import given, settings
from hypothesis import strategies as st

from potluck.protocol import envelope
from potluck.protocol.envelope import TrustPolicy, key_id_bytes, seal, subkey_bytes, verify
from potluck.protocol.errors import RecordError
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.records import PeerRecord, canonical_json
from tests.unit.protocol.conftest import NOW, make_job, make_peer_record

# Hypothesis tests take a module-level policy: function fixtures are not reset between examples.
POLICY = TrustPolicy("swarm-a", Identity.generate().public_key)
SIGNER = Identity.generate()


def stored(value: bytes) -> bytes:
    """What hivemind hands a validator: the application value, msgpack-serialized."""
    return bytes(MSGPackSerializer.dumps(value))


def check(policy, value, *, name="peers", subkey=None, expiration=NOW + 30, now=NOW, swarm=None):
    key = key_id_bytes(swarm or policy.swarm_id, name)
    return verify(policy, key, subkey_bytes(subkey), stored(value), expiration, now)


def test_valid_peer_record_accepted(policy):
    peer = Identity.generate()
    rec = make_peer_record(peer)
    v = check(policy, seal(peer, "swarm-a", "peers", rec, NOW + 30, peer.peer_id), subkey=peer.peer_id)
    assert isinstance(v.record, PeerRecord) and v.record == rec
    assert v.signer == peer.peer_id


def test_valid_job_accepted_only_from_coordinator(policy, coordinator):
    job = make_job()
    v = check(policy, seal(coordinator, "swarm-a", "job", job, NOW + 30), name="job")
    assert isinstance(v.record, JobSpec) and v.record.name == "tiny"
    impostor = Identity.generate()
    with pytest.raises(RecordError, match="not signed by the swarm's coordinator"):
        check(policy, seal(impostor, "swarm-a", "job", job, NOW + 30), name="job")


def test_forged_signature_rejected(policy):
    peer = Identity.generate()
    value = seal(peer, "swarm-a", "peers", make_peer_record(peer), NOW + 30, peer.peer_id)
    fields = msgpack.unpackb(value)
    fields[6] = bytes([fields[6][0] ^ 1]) + fields[6][1:]  # flip one bit of the signature
    with pytest.raises(RecordError, match="bad signature"):
        check(policy, msgpack.packb(fields), subkey=peer.peer_id)
    fields = msgpack.unpackb(value)
    fields[4] = fields[4].replace(b"test cpu", b"test gpu")  # alter the body
    with pytest.raises(RecordError, match="bad signature"):
        check(policy, msgpack.packb(fields), subkey=peer.peer_id)


def test_cannot_write_under_another_peers_subkey(policy):
    victim, attacker = Identity.generate(), Identity.generate()
    rec = make_peer_record(attacker, peer_id=victim.peer_id)  # claims the victim's id
    value = seal(attacker, "swarm-a", "peers", rec, NOW + 30, victim.peer_id)
    with pytest.raises(RecordError, match="subkey is not the signer's peer id"):
        check(policy, value, subkey=victim.peer_id)


def test_replay_under_other_subkey_key_or_lifetime_rejected(policy):
    peer = Identity.generate()
    value = seal(peer, "swarm-a", "peers", make_peer_record(peer), NOW + 30, peer.peer_id)
    with pytest.raises(RecordError, match="bad signature"):
        check(policy, value, subkey=Identity.generate().peer_id)
    with pytest.raises(RecordError, match="bad signature"):
        check(policy, value, subkey=peer.peer_id, expiration=NOW + 60)  # lifetime extended
    with pytest.raises(RecordError, match="key mismatch"):
        check(policy, value, subkey=peer.peer_id, name="job")


def test_wrong_swarm_rejected(policy):
    peer = Identity.generate()
    value = seal(peer, "swarm-b", "peers", make_peer_record(peer), NOW + 30, peer.peer_id)
    with pytest.raises(RecordError, match="wrong swarm"):
        check(policy, value, subkey=peer.peer_id, swarm="swarm-b")


def test_expired_and_far_future_rejected(policy):
    peer = Identity.generate()
    old = seal(peer, "swarm-a", "peers", make_peer_record(peer), NOW - 3600, peer.peer_id)
    with pytest.raises(RecordError, match="stale"):
        check(policy, old, subkey=peer.peer_id, expiration=NOW - 3600)
    far = seal(peer, "swarm-a", "peers", make_peer_record(peer), NOW + 86400, peer.peer_id)
    with pytest.raises(RecordError, match="too far in the future"):
        check(policy, far, subkey=peer.peer_id, expiration=NOW + 86400)
    with pytest.raises(RecordError, match="finite"):
        check(policy, far, subkey=peer.peer_id, expiration=float("inf"))


def test_oversized_rejected_before_parsing(policy):
    with pytest.raises(RecordError, match="oversized"):
        check(policy, b"\x00" * (policy.max_value_bytes + 1))


def test_signed_but_schema_invalid_rejected(policy):
    peer = Identity.generate()
    body = make_peer_record(peer).model_dump(mode="json")
    body["hardware"]["memory_total_bytes"] = -1
    raw = canonical_json(body)
    key, sk = key_id_bytes("swarm-a", "peers"), subkey_bytes(peer.peer_id)
    msg = envelope._signed_message("swarm-a", "peers", "PeerRecord", key, sk, NOW + 30, raw)
    value = msgpack.packb(
        [envelope.MAGIC, "swarm-a", "peers", "PeerRecord", raw, peer.public_key, peer.sign(msg)]
    )
    with pytest.raises(RecordError, match=r"schema: PeerRecord\.hardware\.memory_total_bytes"):
        check(policy, value, subkey=peer.peer_id)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_random_bytes_never_pass(data):
    with pytest.raises(RecordError):
        verify(POLICY, key_id_bytes("swarm-a", "peers"), subkey_bytes(None), data, NOW + 30, NOW)


_msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=64),
    lambda children: (
        st.lists(children, max_size=8) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@pytest.mark.slow  # 2 s alone, 23.8 s in a full tier beside a swarm test (2026-11-29): over the 10 s guard
@settings(max_examples=300, deadline=None)
@given(_msgpack_values)
def test_random_structures_never_pass(obj):
    packed = msgpack.packb(obj, use_bin_type=True)
    for value in (packed, stored(packed)):
        with pytest.raises(RecordError):
            verify(POLICY, key_id_bytes("swarm-a", "peers"), subkey_bytes(None), value, NOW + 30, NOW)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 255))
def test_any_single_byte_corruption_is_caught(pos, byte):
    peer = SIGNER
    value = seal(peer, "swarm-a", "peers", make_peer_record(peer), NOW + 30, peer.peer_id)
    pos %= len(value)
    if value[pos] == byte:
        return
    corrupted = value[:pos] + bytes([byte]) + value[pos + 1 :]
    with pytest.raises(RecordError):
        check(POLICY, corrupted, subkey=peer.peer_id)
