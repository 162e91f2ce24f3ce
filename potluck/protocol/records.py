"""Typed, versioned records that peers and the coordinator publish.

Records are pydantic models with ``extra="forbid"`` and bounded strings and lists, so a malformed or
oversized record fails validation instead of reaching code. ``canonical_bytes`` gives the one encoding
that is signed: sorted keys, no whitespace, no NaN.
"""

from __future__ import annotations

import json
from typing import Annotated, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from potluck import __version__

Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
ShortText = Annotated[str, Field(max_length=128)]
Multiaddr = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^/")]
PeerId = Annotated[str, Field(min_length=16, max_length=64, pattern=r"^[1-9A-HJ-NP-Za-km-z]+$")]
DeviceKind = Literal["cuda", "rocm", "mps", "xpu", "cpu"]
NonNegFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


class Record(BaseModel):
    """Base of every record: immutable, strict about unknown fields, versioned."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    KIND: ClassVar[str] = "Record"

    version: Literal[1] = 1

    def canonical_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json"))


def canonical_json(obj: object) -> bytes:
    """One byte string per value: what signatures cover."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


# ---- peers -----------------------------------------------------------------------------------------------


class Hardware(BaseModel):
    """What a peer measured about its machine at start-up (see ``potluck.peer.probe``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    device_kind: DeviceKind
    device_name: ShortText
    memory_total_bytes: int = Field(ge=0, le=2**44)  # the device's memory (system RAM for cpu); <= 16 TiB
    memory_free_bytes: int = Field(ge=0, le=2**44)
    cpu_cores: int = Field(ge=1, le=4096)
    # measured dense matmul throughput, 10^12 FLOP/s; bounded so that no claim can distort the planner's
    # arithmetic (the planner caps them further: coordinator/job/claims.py)
    tflops_fp32: float = Field(ge=0.0, le=10_000.0, allow_inf_nan=False)
    tflops_bf16: float = Field(ge=0.0, le=10_000.0, allow_inf_nan=False)
    # Work slots the peer offers on its device: 2 lets the planner place two replicas or two stages on
    # it, run tick-tock (docs/ticktock.md). Written only when not 1, so a one-slot peer's record is
    # byte for byte what releases without the field sign and accept.
    slots: int = Field(default=1, ge=1, le=2)
    # Two waves' throughput over one wave's on this device, measured at start-up by a two-slot peer or a
    # peer sharing its device with a co-tenant (``peer/probe.py``: the matmul probe run alone, then twice
    # at once). The planner prices a second slot with it, the allocator two jobs sharing the device;
    # None (not written): not measured.
    pair_speedup: float | None = Field(default=None, gt=0.0, le=2.0, allow_inf_nan=False)

    @model_serializer(mode="wrap")
    def _omit_default_slots(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        out: dict[str, object] = handler(self)
        if out.get("slots") == 1:
            del out["slots"]
        if out.get("pair_speedup", 0) is None:
            del out["pair_speedup"]
        return out

    @property
    def label(self) -> str:
        """How people name the device: "NVIDIA GeForce RTX 3060 (cuda)", or the CPU's name."""
        return self.device_name if self.device_kind == "cpu" else f"{self.device_name} ({self.device_kind})"

    @field_validator("memory_free_bytes")
    @classmethod
    def _free_le_total(cls, v: int, info: object) -> int:
        total = getattr(info, "data", {}).get("memory_total_bytes")
        if total is not None and v > total:
            raise ValueError("memory_free_bytes exceeds memory_total_bytes")
        return v


class PeerRecord(Record):
    """A peer's heartbeat: who it is, what it runs on, where to reach it. Stored under subkey = peer id."""

    KIND: ClassVar[str] = "PeerRecord"

    peer_id: PeerId
    software: ShortText = f"potluck/{__version__}"
    status: Literal["online", "leaving"] = "online"
    hardware: Hardware
    maddrs: list[Multiaddr] = Field(default_factory=list, max_length=16)
    issued_at: NonNegFloat  # DHT time (unix seconds) when signed; age of a heartbeat = now - issued_at
    # Behind a NAT without port forwarding (``--reachability private``): reachable only through the relay
    # circuits among ``maddrs``; it dials public peers itself, and two such peers talk through a relay.
    behind_nat: bool = False
    # Space sharing (``potluck peer --share-device``, docs/multijob.md): a device that may run two jobs at
    # once is two peers, the volunteer's own (``cotenant`` names the second) and a co-tenant process it
    # starts (``cotenant_of`` names the first). The allocator believes a pair only when both records name
    # each other; a co-tenant serves a job only when a lease names it. Neither field is written when
    # None, so other peers' records stay byte for byte what releases without them sign.
    cotenant: PeerId | None = None
    cotenant_of: PeerId | None = None

    @model_serializer(mode="wrap")
    def _omit_no_cotenant(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        out: dict[str, object] = handler(self)
        for key in ("cotenant", "cotenant_of"):
            if key in out and out[key] is None:
                del out[key]
        return out

    @model_validator(mode="after")
    def _one_side(self) -> PeerRecord:
        if self.cotenant is not None and self.cotenant_of is not None:
            raise ValueError("a peer is a device's own peer or its co-tenant, not both")
        if self.peer_id in (self.cotenant, self.cotenant_of):
            raise ValueError("a peer cannot be its own co-tenant")
        return self


class LinkSample(BaseModel):
    """One measured link from the reporting peer to ``dst``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    dst: PeerId
    rtt_ms: float = Field(ge=0.0, le=600_000.0, allow_inf_nan=False)  # median round trip, milliseconds
    bandwidth_gbps: float = Field(ge=0.0, le=100_000.0, allow_inf_nan=False)  # measured goodput, Gbit/s
    relayed: bool = False  # the measured connection ran through a libp2p relay (a /p2p-circuit address)


class AccessLink(BaseModel):
    """A peer's own access link as its owner declares it (``potluck peer --upload-mbps/--download-mbps``),
    Gbit/s; None where not declared. Home links upload 5-20x slower than they download: the planner
    costs each transfer over the direction it flows, capped by these (coordinator/job/claims.py bounds
    a declaration by what the peer's probes showed)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    upload_gbps: float | None = Field(default=None, gt=0.0, le=100_000.0)
    download_gbps: float | None = Field(default=None, gt=0.0, le=100_000.0)


class LinkReport(Record):
    """What a peer measured towards a sample of others. Stored under subkey = reporter's peer id."""

    KIND: ClassVar[str] = "LinkReport"

    peer_id: PeerId
    links: list[LinkSample] = Field(max_length=64)
    issued_at: NonNegFloat
    access: AccessLink = Field(default_factory=AccessLink)
    # The other end's view: goodput of the probes this peer served, from ``dst`` (the prober) to it, as
    # timed on arrival here (rtt_ms 0: only the prober can time a round trip). The coordinator believes
    # a prober's claim only as far as the receiver saw it (coordinator/job/claims.py).
    inbound: list[LinkSample] = Field(default_factory=list, max_length=64)
