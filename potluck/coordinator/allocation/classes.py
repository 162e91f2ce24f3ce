"""Peer classes: volunteers grouped by what makes a job run at a different speed on them.

A class is (device model, measured TFLOP/s tier, memory tier, uplink tier). Tiers are logarithmic, so
peers within a factor of about 1.4 in TFLOP/s, 2 in memory and 10 in uplink share a class, and a
class's rate measured on a few of its peers stands for all of them:

- TFLOP/s tier ``f = floor(2 * log2(tflops))``: half-octaves (a throttled laptop 3060 is not a desktop one);
- memory tier ``m = floor(log2(GiB))``: 8, 16, 32 GiB ... (what fits, hence the pipeline depth);
- uplink tier ``u = floor(log10(Mbit/s))``: 1-10, 10-100, 100-1000 Mbit/s ... ("u-" when undeclared).

The name reads ``cuda:nvidia-geforce-rtx-3090/f10/m4/u2``. A caller may name classes itself
(``PeerInfo.peer_class``), as the simulator does with Gavel's "k80", "p100", "v100".
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from potluck.protocol.records import AccessLink, Hardware, PeerRecord

logger = logging.getLogger(__name__)

GIB = float(1 << 30)
_SLUG = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True)
class PeerInfo:
    """What the allocator needs of one live peer."""

    peer_id: str
    hardware: Hardware | None = None
    uplink_gbps: float | None = None  # declared (AccessLink) or measured upload, Gbit/s
    shareable: bool = False  # its owner lets two jobs share the device (space sharing)
    peer_class: str | None = None  # a class named by the caller; else derived from hardware
    # the co-tenant peer that serves a second job on this device (``PeerRecord.cotenant``); None in a
    # simulation, where a shareable worker serves both jobs itself
    cotenant: str | None = None

    @classmethod
    def from_record(
        cls, record: PeerRecord, access: AccessLink | None = None, cotenant: str | None = None
    ) -> PeerInfo:
        """``cotenant``: the live co-tenant that names this peer back (``shared_devices``), if any."""
        up = access.upload_gbps if access is not None else None
        return cls(record.peer_id, record.hardware, up, shareable=cotenant is not None, cotenant=cotenant)


def shared_devices(records: Mapping[str, PeerRecord]) -> dict[str, str]:
    """Device peer -> its co-tenant, for each pair of live peers whose records name each other.

    One side's word is not enough: a peer naming someone else's co-tenant, or a co-tenant naming a peer
    that does not name it back, shares nothing (and such a co-tenant is never a worker of its own)."""
    out = {}
    for peer_id, record in sorted(records.items()):
        other = records.get(record.cotenant) if record.cotenant is not None else None
        if other is not None and other.cotenant_of == peer_id:
            out[peer_id] = other.peer_id
    return out


def is_cotenant(record: PeerRecord) -> bool:
    """A co-tenant process serves only the jobs a lease names it for: never a worker of its own."""
    return record.cotenant_of is not None


@dataclass(frozen=True)
class ClassProfile:
    """A class as the cost-model prior sees it: its slowest, smallest, worst-connected member."""

    name: str
    peers: tuple[str, ...]  # sorted peer ids
    tflops: float  # the lowest measured TFLOP/s (fp32) in the class
    memory_gb: float  # the smallest free device memory, 1e9 bytes
    uplink_gbps: float | None  # the lowest declared uplink, Gbit/s; None when no peer declared one
    shareable: bool  # every peer of the class allows space sharing
    # peer -> its co-tenant, for the class's shared devices (empty in a simulation)
    cotenants: tuple[tuple[str, str], ...] = ()
    # two jobs' throughput together over one job's, the class's lowest measured (``Hardware.pair_speedup``)
    pair_speedup: float | None = None

    @property
    def workers(self) -> int:
        return len(self.peers)


def class_name(hw: Hardware, uplink_gbps: float | None) -> str:
    """The class a peer with this hardware and uplink falls in (see the module docstring)."""
    device = _SLUG.sub("-", hw.device_name.lower()).strip("-")[:48] or "unknown"
    f = math.floor(2.0 * math.log2(max(hw.tflops_fp32, 1e-3)))
    mem = math.floor(math.log2(max(hw.memory_free_bytes / GIB, 1.0 / 64)))
    up = "-" if uplink_gbps is None else str(math.floor(math.log10(max(uplink_gbps * 1e3, 1e-3))))
    return f"{hw.device_kind}:{device}/f{f}/m{mem}/u{up}"


def classify(peer: PeerInfo) -> str:
    if peer.peer_class is not None:
        return peer.peer_class
    if peer.hardware is None:
        return "unknown"
    return class_name(peer.hardware, peer.uplink_gbps)


def group(peers: Sequence[PeerInfo]) -> dict[str, ClassProfile]:
    """Classes of the live peers, by name (sorted), each with its members sorted by peer id."""
    members: dict[str, list[PeerInfo]] = {}
    for p in peers:
        members.setdefault(classify(p), []).append(p)
    out: dict[str, ClassProfile] = {}
    for name in sorted(members):
        ps = sorted(members[name], key=lambda p: p.peer_id)
        hws = [p.hardware for p in ps if p.hardware is not None]
        ups = [p.uplink_gbps for p in ps if p.uplink_gbps is not None]
        out[name] = ClassProfile(
            name=name,
            peers=tuple(p.peer_id for p in ps),
            tflops=min((h.tflops_fp32 for h in hws), default=0.0),
            memory_gb=min((h.memory_free_bytes / 1e9 for h in hws), default=0.0),
            uplink_gbps=min(ups) if ups else None,
            shareable=all(p.shareable for p in ps),
            cotenants=tuple((p.peer_id, p.cotenant) for p in ps if p.cotenant is not None),
            pair_speedup=min((h.pair_speedup for h in hws if h.pair_speedup is not None), default=None),
        )
    return out
