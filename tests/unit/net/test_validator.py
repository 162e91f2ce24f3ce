"""The hivemind side of record checks: key ids match hivemind's, and its validator hook runs verify."""

import dataclasses

import msgpack
import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils.serializer import MSGPackSerializer

from potluck.net.validator import PotluckValidator
from potluck.protocol.envelope import TrustPolicy, key_id_bytes, seal, subkey_bytes
from potluck.protocol.errors import RecordError
from potluck.protocol.identity import Identity
from potluck.protocol.keys import KEY_SPECS, dht_key
from tests.unit.protocol.conftest import NOW, make_peer_record


@pytest.fixture
def policy() -> TrustPolicy:
    return TrustPolicy("swarm-a", Identity.generate().public_key)


def stored(value: bytes) -> bytes:
    return bytes(MSGPackSerializer.dumps(value))


@pytest.mark.parametrize("name", sorted(KEY_SPECS))
@pytest.mark.parametrize("swarm", ["swarm-a", "demo-7f3a", "x" * 40])
def test_key_ids_equal_hivemind(swarm, name):
    """protocol computes DHT key ids without hivemind; they must be the bytes hivemind routes by."""
    assert key_id_bytes(swarm, name) == DHTID.generate(source=dht_key(swarm, name)).to_bytes()


@pytest.mark.parametrize("subkey", [None, "", "12D3KooWPeer", 0, 7, -3, 2**40, 1.5, b"raw"])
def test_subkey_bytes_equal_hivemind(subkey):
    assert subkey_bytes(subkey) == MSGPackSerializer.dumps(subkey)


def test_container_subkeys_refused():
    with pytest.raises(RecordError, match="subkey"):
        subkey_bytes(("a", 1))


def test_hivemind_validator_interface(policy):
    peer = Identity.generate()
    validator = PotluckValidator(dataclasses.replace(policy, clock_skew_s=1e12))  # NOW is in the future here
    value = seal(peer, "swarm-a", "peers", make_peer_record(peer), NOW + 30, peer.peer_id)
    good = DHTRecord(key_id_bytes("swarm-a", "peers"), subkey_bytes(peer.peer_id), stored(value), NOW + 30)
    assert validator.validate(good)
    fields = msgpack.unpackb(value)
    fields[6] = bytes(64)  # the signature
    bad = dataclasses.replace(good, value=stored(msgpack.packb(fields, use_bin_type=True)))
    assert not validator.validate(bad)
    assert validator.rejected == 1
    assert validator.sign_value(good) == good.value and validator.strip_value(good) == good.value
