"""Join tokens, admissions and bans: only what the coordinator signed for this peer and swarm, and not
yet expired, lets a peer's records through; forged, replayed, expired and banned ones are refused."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from potluck.coordinator.admission import AdmissionDesk
from potluck.coordinator.config import AdmitConfig
from potluck.net.admit import admitted
from potluck.protocol.admission import Admission, JoinToken
from potluck.protocol.envelope import TrustPolicy, seal
from potluck.protocol.errors import AdmissionError, RecordError
from potluck.protocol.identity import Identity
from potluck.transfer.server import encode_request, parse_request
from tests.unit.protocol.conftest import NOW, make_peer_record
from tests.unit.protocol.test_envelope import check

COORD = Identity.generate()
POLICY = TrustPolicy("swarm-a", COORD.public_key, require_admission=True)


def admitted_record(peer, admission=None, expires=NOW + 3600):
    adm = admission
    if adm is None:
        adm = Admission.issue(COORD, "swarm-a", peer.peer_id, expires, ("peer",)).encode()
    return seal(peer, "swarm-a", "peers", make_peer_record(peer), NOW + 30, peer.peer_id, adm)


def test_an_admitted_peers_record_passes_and_an_unadmitted_ones_does_not():
    peer = Identity.generate()
    assert check(POLICY, admitted_record(peer), subkey=peer.peer_id).signer == peer.peer_id
    bare = seal(peer, "swarm-a", "peers", make_peer_record(peer), NOW + 30, peer.peer_id)
    with pytest.raises(AdmissionError, match="never admitted"):
        check(POLICY, bare, subkey=peer.peer_id)
    # a swarm that does not ask for admissions (raw test nodes) still takes it
    assert check(TrustPolicy("swarm-a", COORD.public_key), bare, subkey=peer.peer_id)


def test_forged_replayed_expired_and_foreign_admissions_are_refused():
    peer, other, impostor = Identity.generate(), Identity.generate(), Identity.generate()
    cases = {
        "not signed by the swarm's coordinator": Admission.issue(
            impostor, "swarm-a", peer.peer_id, NOW + 99, ()
        ),
        "another peer": Admission.issue(COORD, "swarm-a", other.peer_id, NOW + 99, ()),  # replayed
        "expired": Admission.issue(COORD, "swarm-a", peer.peer_id, NOW - 3600, ()),
        "for swarm 'swarm-b'": Admission.issue(COORD, "swarm-b", peer.peer_id, NOW + 99, ()),
    }
    for why, adm in cases.items():
        with pytest.raises(AdmissionError, match=why):
            check(POLICY, admitted_record(peer, adm.encode()), subkey=peer.peer_id)
    # a valid admission with its expiry pushed out by hand no longer verifies
    good = Admission.issue(COORD, "swarm-a", peer.peer_id, NOW - 3600, ("peer",))
    stretched = Admission(good.swarm_id, good.peer_id, NOW + 9e9, good.roles, good.signature)
    with pytest.raises(AdmissionError, match="not signed"):
        check(POLICY, admitted_record(peer, stretched.encode()), subkey=peer.peer_id)


def test_a_banned_peer_is_refused_even_with_a_valid_admission():
    peer = Identity.generate()
    policy = TrustPolicy("swarm-a", COORD.public_key, require_admission=True)
    policy.banned.add(peer.peer_id)
    with pytest.raises(AdmissionError, match="banned"):
        check(policy, admitted_record(peer), subkey=peer.peer_id)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
def test_garbage_admissions_are_refused_cleanly(data):
    peer = Identity.generate()
    with pytest.raises(AdmissionError):
        check(POLICY, admitted_record(peer, data), subkey=peer.peer_id)


def test_tokens_are_checked_and_counted_by_the_desk():
    desk = AdmissionDesk(COORD, "swarm-a", AdmitConfig(), set())
    once = JoinToken.mint(COORD, "swarm-a", NOW + 60, max_uses=1)
    a, b = Identity.generate().peer_id, Identity.generate().peer_id
    adm = desk.decide(a, once, NOW)
    adm.check("swarm-a", COORD.public_key, a, NOW, 0.0)
    assert desk.decide(a, once, NOW + 10).expires > adm.expires  # renewing uses nothing up
    with pytest.raises(AdmissionError, match="used up"):
        desk.decide(b, once, NOW)
    for token, why in [
        (None, "no valid join token"),
        ("made-up", "no valid join token"),
        (JoinToken.mint(Identity.generate(), "swarm-a", NOW + 60), "not signed"),
        (JoinToken.mint(COORD, "swarm-b", NOW + 60), "swarm-b"),
        (JoinToken.mint(COORD, "swarm-a", NOW - 1), "expired"),
        (once[:-3] + "AAA", "not signed|base64"),
    ]:
        with pytest.raises(AdmissionError, match=why):
            desk.decide(b, token, NOW)
    desk.banned.add(a)
    with pytest.raises(AdmissionError, match="banned"):
        desk.decide(a, once, NOW)


def test_token_uses_survive_a_restarted_coordinator_through_a_signed_record():
    from potluck.protocol.admission import TokenUses

    desk = AdmissionDesk(COORD, "swarm-a", AdmitConfig(), set())
    twice = JoinToken.mint(COORD, "swarm-a", NOW + 600, max_uses=2)
    endless = JoinToken.mint(COORD, "swarm-a", NOW + 600)
    a, b, c = (Identity.generate().peer_id for _ in range(3))
    before = desk.version
    desk.decide(a, twice, NOW)
    desk.decide(a, endless, NOW)  # an unlimited token needs no counting
    assert desk.version == before + 1
    record = desk.record(NOW)
    assert [(t.peers, t.expires) for t in record.tokens] == [([a], NOW + 600)]
    # published signed by the coordinator, read back by the restarted one (a new desk)
    raw = seal(COORD, "swarm-a", "tokens", record, NOW + 30)
    restored = AdmissionDesk(COORD, "swarm-a", AdmitConfig(), set())
    read = check(POLICY, raw, name="tokens")
    assert isinstance(read.record, TokenUses)
    restored.restore(read.record, NOW + 1)
    restored.decide(b, twice, NOW + 2)
    with pytest.raises(AdmissionError, match="used up"):
        restored.decide(c, twice, NOW + 3)  # 3 peers on a 2-use token across the restart: refused
    restored.decide(a, twice, NOW + 4)  # a renewal still uses nothing up
    assert restored.record(NOW + 601).tokens == []  # expired tokens are dropped, not kept forever
    # nobody but the coordinator may write the uses
    forged = seal(Identity.generate(), "swarm-a", "tokens", record, NOW + 30)
    with pytest.raises(RecordError, match=r"signature|signed"):
        check(POLICY, forged, name="tokens")


def test_an_open_desk_admits_anyone_but_the_banned():
    desk = AdmissionDesk(COORD, "swarm-a", AdmitConfig(open=True), {"banned-peer-id-000"})
    peer = Identity.generate().peer_id
    desk.decide(peer, None, NOW).check("swarm-a", COORD.public_key, peer, NOW, 0.0)
    with pytest.raises(AdmissionError, match="banned"):
        desk.decide("banned-peer-id-000", None, NOW)


def test_state_is_served_to_the_coordinator_and_admitted_peers_only():
    peer, stranger = Identity.generate(), Identity.generate()
    adm = Admission.issue(COORD, "swarm-a", peer.peer_id, NOW + 60, ("peer",)).encode()
    policy = TrustPolicy("swarm-a", COORD.public_key, require_admission=True)
    assert admitted(policy, COORD.peer_id, None, NOW)  # the owner's copy
    assert admitted(policy, peer.peer_id, adm, NOW)
    assert not admitted(policy, stranger.peer_id, None, NOW)
    assert not admitted(policy, stranger.peer_id, adm, NOW)  # another peer's admission
    assert not admitted(policy, peer.peer_id, adm, NOW + 3600)  # expired
    assert not admitted(policy, peer.peer_id, b"garbage", NOW)
    policy.banned.add(peer.peer_id)
    assert not admitted(policy, peer.peer_id, adm, NOW)
    # the admission rides in the state request
    assert parse_request(encode_request("job", 3, 0, 2, adm)) == ("job", 3, 0, 2, adm)
    assert parse_request(encode_request("job", 3, 0, 2)) == ("job", 3, 0, 2, None)
