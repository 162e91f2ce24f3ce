"""Who is in the swarm: live peers from verified heartbeats. Pure: records and a clock in, a view out."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from potluck.protocol.envelope import Verified
from potluck.protocol.records import LinkReport, PeerRecord


@dataclass(frozen=True)
class PeerView:
    """One live peer as seen at ``now``."""

    record: PeerRecord
    expiration: float  # DHT time at which its heartbeat lapses

    @property
    def peer_id(self) -> str:
        return self.record.peer_id

    def age_s(self, now: float) -> float:
        """Seconds since the peer signed its last heartbeat (never negative under clock skew)."""
        return max(0.0, now - self.record.issued_at)

    def summary(self, now: float) -> dict[str, object]:
        hw = self.record.hardware
        return {
            "peer_id": self.peer_id,
            "device_kind": hw.device_kind,
            "device_name": hw.device_name,
            "memory_total_bytes": hw.memory_total_bytes,
            "memory_free_bytes": hw.memory_free_bytes,
            "cpu_cores": hw.cpu_cores,
            "tflops_fp32": hw.tflops_fp32,
            "tflops_bf16": hw.tflops_bf16,
            "heartbeat_age_s": round(self.age_s(now), 2),
            "software": self.record.software,
            "maddrs": list(self.record.maddrs),
        }


def live_peers(records: Iterable[Verified], now: float) -> list[PeerView]:
    """Peers whose latest heartbeat says "online" and has not expired, sorted by peer id."""
    latest: dict[str, Verified] = {}
    for v in records:
        if not isinstance(v.record, PeerRecord):
            continue
        best = latest.get(v.record.peer_id)
        if best is None or v.expiration > best.expiration:
            latest[v.record.peer_id] = v
    views = [
        PeerView(v.record, v.expiration)
        for v in latest.values()
        if isinstance(v.record, PeerRecord) and v.record.status == "online" and v.expiration > now
    ]
    return sorted(views, key=lambda p: p.peer_id)


def link_reports(records: Iterable[Verified], live_ids: Iterable[str], now: float) -> dict[str, LinkReport]:
    """The newest unexpired link report of each live peer, keeping only links to live peers."""
    live = set(live_ids)
    newest: dict[str, Verified] = {}
    for v in records:
        if isinstance(v.record, LinkReport) and v.record.peer_id in live and v.expiration > now:
            best = newest.get(v.record.peer_id)
            if best is None or v.expiration > best.expiration:
                newest[v.record.peer_id] = v
    out: dict[str, LinkReport] = {}
    for pid, v in sorted(newest.items()):
        report = v.record
        assert isinstance(report, LinkReport)
        kept = [s for s in report.links if s.dst in live and s.dst != pid]
        out[pid] = report.model_copy(update={"links": kept})
    return out


def links_summary(reports: dict[str, LinkReport]) -> list[dict[str, object]]:
    return [
        {"src": src, "dst": s.dst, "rtt_ms": round(s.rtt_ms, 3), "bandwidth_gbps": round(s.bandwidth_gbps, 4)}
        for src, report in reports.items()
        for s in report.links
    ]
