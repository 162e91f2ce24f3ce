"""Typed, versioned records that peers and the coordinator publish.

Records are pydantic models with ``extra="forbid"`` and bounded strings and lists, so a malformed or
oversized record fails validation instead of reaching code. ``canonical_bytes`` gives the one encoding
that is signed: sorted keys, no whitespace, no NaN.
"""

from __future__ import annotations

import json
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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
    memory_total_bytes: int = Field(ge=0, le=2**50)  # the device's memory (system RAM for cpu)
    memory_free_bytes: int = Field(ge=0, le=2**50)
    cpu_cores: int = Field(ge=1, le=4096)
    tflops_fp32: NonNegFloat  # measured dense matmul throughput, 10^12 FLOP/s
    tflops_bf16: NonNegFloat

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


class LinkSample(BaseModel):
    """One measured link from the reporting peer to ``dst``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    dst: PeerId
    rtt_ms: float = Field(ge=0.0, le=600_000.0, allow_inf_nan=False)  # median round trip, milliseconds
    bandwidth_gbps: float = Field(ge=0.0, le=100_000.0, allow_inf_nan=False)  # measured goodput, Gbit/s


class LinkReport(Record):
    """What a peer measured towards a sample of others. Stored under subkey = reporter's peer id."""

    KIND: ClassVar[str] = "LinkReport"

    peer_id: PeerId
    links: list[LinkSample] = Field(max_length=64)
    issued_at: NonNegFloat


# ---- jobs ------------------------------------------------------------------------------------------------


class ModelSpec(BaseModel):
    """A decoder-only transformer's shape. Later issues add the architecture options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_layers: int = Field(ge=1, le=1024)
    d_model: int = Field(ge=8, le=65536)
    n_heads: int = Field(ge=1, le=1024)
    vocab_size: int = Field(ge=2, le=1_048_576)
    seq_len: int = Field(ge=2, le=1_048_576)

    @field_validator("n_heads")
    @classmethod
    def _heads_divide_width(cls, v: int, info: object) -> int:
        d_model = getattr(info, "data", {}).get("d_model")
        if d_model is not None and d_model % v:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({v})")
        return v

    @property
    def n_params(self) -> int:
        """Parameters of a Llama-style model: embeddings + per layer 4 d^2 attention + ~8 d^2 SwiGLU."""
        d = self.d_model
        return self.vocab_size * d * 2 + self.n_layers * 12 * d * d


class BatchSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens_per_step: int = Field(ge=1, le=2**40)  # global batch, summed over data-parallel replicas
    micro_batch_size: int = Field(ge=1, le=65536)  # sequences per pipeline micro-batch


class JobSpec(Record):
    """What the coordinator is asked to train. Signed by the coordinator, stored under the job key."""

    KIND: ClassVar[str] = "JobSpec"

    name: Name
    seed: int = Field(default=0, ge=0, lt=2**63)
    steps: int = Field(default=100, ge=1, le=10**9)
    min_peers: int = Field(default=1, ge=1, le=100_000)
    model: ModelSpec
    batch: BatchSpec


RECORD_TYPES: dict[str, type[Record]] = {cls.KIND: cls for cls in (PeerRecord, LinkReport, JobSpec)}
