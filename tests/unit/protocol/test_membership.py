from potluck.protocol.envelope import Verified
from potluck.protocol.identity import Identity
from potluck.protocol.membership import live_peers
from tests.unit.protocol.conftest import NOW, make_job, make_peer_record


def verified(ident, exp, **kw):
    rec = make_peer_record(ident, **kw)
    return Verified("peers", ident.peer_id, rec, ident.public_key, exp)


def test_live_peers_filters_leaving_expired_and_keeps_latest():
    a, b, c, d = (Identity.generate() for _ in range(4))
    records = [
        verified(a, NOW + 10),
        verified(b, NOW + 10),
        verified(b, NOW + 12, status="leaving"),  # b withdrew: the later record wins
        verified(c, NOW - 1),  # c's heartbeat lapsed
        verified(d, NOW + 5, issued_at=NOW - 3),
        Verified("job", None, make_job(), a.public_key, NOW + 10),  # not a peer record
    ]
    peers = live_peers(records, NOW)
    assert [p.peer_id for p in peers] == sorted([a.peer_id, d.peer_id])
    by_id = {p.peer_id: p for p in peers}
    assert by_id[d.peer_id].age_s(NOW) == 3.0
    assert by_id[a.peer_id].age_s(NOW - 100) == 0.0  # clock skew never gives a negative age
    assert by_id[a.peer_id].summary(NOW)["device_name"] == "test cpu"
