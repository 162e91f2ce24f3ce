"""SwarmState: the coordinator's view of the live swarm, built from validated records only (pure data)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from potluck.protocol.envelope import Verified
from potluck.protocol.membership import PeerView, live_peers


@dataclass(frozen=True)
class SwarmState:
    swarm_id: str
    as_of: float  # DHT time of the read
    peers: dict[str, PeerView] = field(default_factory=dict)

    @classmethod
    def from_records(cls, swarm_id: str, records: Iterable[Verified], now: float) -> SwarmState:
        return cls(swarm_id, now, {p.peer_id: p for p in live_peers(records, now)})

    def diff(self, previous: SwarmState) -> tuple[list[str], list[str]]:
        """(joined, left) peer ids relative to ``previous``."""
        joined = sorted(set(self.peers) - set(previous.peers))
        left = sorted(set(previous.peers) - set(self.peers))
        return joined, left
