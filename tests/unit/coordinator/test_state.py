"""The coordinator's view of the swarm: live peers, and the ones leaving gracefully."""

from potluck.coordinator.state import SwarmState
from potluck.protocol.identity import Identity
from tests.unit.protocol.conftest import NOW
from tests.unit.protocol.test_membership import verified


def test_a_peer_whose_newest_heartbeat_says_leaving_is_not_live_but_known_to_be_leaving():
    a, b, c = (Identity.generate() for _ in range(3))
    records = [
        verified(a, NOW + 10),
        verified(b, NOW + 10),
        verified(b, NOW + 12, status="leaving"),  # b announced its leave: still serving its state
        verified(c, NOW + 12),
        verified(c, NOW + 5, status="leaving"),  # an older "leaving" that c's newer heartbeat replaced
    ]
    state = SwarmState.from_records("s", records, [], NOW)
    assert set(state.peers) == {a.peer_id, c.peer_id}
    assert state.leaving == {b.peer_id}
    assert state.without([a.peer_id]).leaving == {b.peer_id}
    gone = SwarmState.from_records("s", records, [], NOW + 13)  # its record expired: just gone
    assert gone.leaving == frozenset()
