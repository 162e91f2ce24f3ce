"""SwarmState: the coordinator's view of the live swarm, built from validated records only (pure data)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from potluck.coordinator.job.claims import confirmed_links
from potluck.protocol.envelope import Verified
from potluck.protocol.membership import PeerView, link_reports, live_peers
from potluck.protocol.records import LinkReport, PeerRecord


@dataclass(frozen=True)
class SwarmState:
    swarm_id: str
    as_of: float  # DHT time of the read
    peers: dict[str, PeerView] = field(default_factory=dict)
    # reporter -> its latest report, each link as far as its other end confirms it (job/claims.py)
    links: dict[str, LinkReport] = field(default_factory=dict)
    # Peers whose newest unexpired heartbeat says "leaving": a graceful leave, still serving its state.
    leaving: frozenset[str] = frozenset()

    @classmethod
    def from_records(
        cls, swarm_id: str, peer_records: Iterable[Verified], link_records: Iterable[Verified], now: float
    ) -> SwarmState:
        peer_records = list(peer_records)
        peers = {p.peer_id: p for p in live_peers(peer_records, now)}
        newest: dict[str, Verified] = {}
        for v in peer_records:
            if isinstance(v.record, PeerRecord) and v.expiration > now:
                best = newest.get(v.record.peer_id)
                newest[v.record.peer_id] = v if best is None or v.expiration > best.expiration else best
        leaving = frozenset(
            p for p, v in newest.items() if isinstance(v.record, PeerRecord) and v.record.status == "leaving"
        )
        links = confirmed_links(link_reports(link_records, peers, now))
        return cls(swarm_id, now, peers, links, leaving)

    def without(self, peer_ids: Iterable[str]) -> SwarmState:
        """This state less ``peer_ids`` (and their link reports): the swarm a plan may use."""
        drop = set(peer_ids)
        if not drop:
            return self
        peers = {p: v for p, v in self.peers.items() if p not in drop}
        links = {
            p: r.model_copy(update={"links": [s for s in r.links if s.dst not in drop]})
            for p, r in self.links.items()
            if p not in drop
        }
        return SwarmState(self.swarm_id, self.as_of, peers, links, self.leaving)

    def diff(self, previous: SwarmState) -> tuple[list[str], list[str]]:
        """(joined, left) peer ids relative to ``previous``."""
        joined = sorted(set(self.peers) - set(previous.peers))
        left = sorted(set(previous.peers) - set(self.peers))
        return joined, left
