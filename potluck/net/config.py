"""Configs of the network runtime: how a node listens and waits, the mailbox bounds, link probes.

Plain dataclasses with no hivemind or torch import, so configs, the CLI and ``--help`` stay fast.
Every network wait in ``potluck.net`` takes its bound from one of these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

Reachability = Literal["auto", "public", "private"]


@dataclass(frozen=True)
class NetworkConfig:
    """How a node listens and how long it waits. Every network wait has one of these bounds."""

    host_maddrs: tuple[str, ...] = ("/ip4/0.0.0.0/tcp/0",)
    announce_maddrs: tuple[str, ...] = ()
    bootstrap_timeout_s: float = 30.0  # keep retrying the bootstrap peers this long before giving up
    request_timeout_s: float = 5.0  # one DHT RPC
    startup_timeout_s: float = 15.0  # p2pd start-up
    use_relay: bool = True  # reach NATed peers through libp2p circuit relays
    use_auto_relay: bool = False  # look for a relay to become reachable ourselves (behind NAT)
    nat_traversal: bool | None = None  # AutoNAT + UPnP; None: on unless every listen address is loopback
    # Whether others can dial this node. "auto": libp2p's AutoNAT decides, which trusts only addresses
    # it deems public. "private" (behind a NAT without port forwarding): hold a reservation on each of
    # ``relays`` (default: the bootstrap peers) and announce circuit addresses through them, so anyone
    # can reach us; we dial out to public peers ourselves. "public": serve as a relay for NATed peers.
    reachability: Reachability = "auto"
    relays: tuple[str, ...] = ()  # multiaddrs ending in /p2p/<relay id>
    relay_check: bool = True  # "public": test our relay with a bulk transfer, restart p2pd if it fails

    @property
    def loopback_only(self) -> bool:
        return all(a.startswith(("/ip4/127.", "/ip6/::1/")) for a in self.host_maddrs)


@dataclass(frozen=True)
class TransportConfig:
    timeout_s: float = 30.0  # bound on every send and receive
    max_pending_bytes: int = 256 << 20  # buffered, not-yet-claimed message bytes per mailbox
    max_pending_per_sender: int = 64 << 20  # of which one sender may hold at most this much
    steps_ahead: int = 8  # messages for a step further ahead of this peer's than this are refused
    epochs_ahead: int = 4  # and those for a plan epoch this far past its current one


@dataclass(frozen=True)
class LinkProbeConfig:
    pings: int = 5  # round trips per measurement; the median is reported
    bulk_bytes: int = 4 << 20  # bytes sent to measure goodput
    frame_bytes: int = 256 << 10  # bytes per BULK frame
    timeout_s: float = 10.0  # bound on every read and write of a probe
    max_stream_bytes: int = 64 << 20  # a probe stream that sends more is cut off (abuse bound)
    sample_size: int = 4  # peers measured per round, at least; grows as ceil(log2 N)
    interval_s: float = 120.0  # seconds between measurement rounds
    # The access link as the volunteer declares it (their plan: "20 up / 200 down"), Mbit/s; published in
    # every LinkReport so the planner knows which direction is slow before probes have covered the swarm.
    upload_mbps: float | None = None
    download_mbps: float | None = None


class Pacer(Protocol):
    """Delays a send as a slower link would (``potluck.testbed.shaping.LinkShaper`` is one)."""

    async def pace(self, src: str, dst: str, nbytes: int) -> None: ...
