"""The telemetry plane's messages: MQTT topics and the signed JSON payloads peers and coordinator publish.

Topics (``docs/telemetry.md`` is the reference, checked against this module by a test)::

    potluck/<swarm>/peer/<peer id>/status        retained; the last will sets state "offline"
    potluck/<swarm>/peer/<peer id>/metrics       every few seconds while the peer runs
    potluck/<swarm>/peer/<peer id>/events        joined, placed, state received, step aborted, ...
    potluck/<swarm>/coordinator/status           retained: the job, the plan, the members
    potluck/<swarm>/coordinator/links            retained: the measured and estimated link matrix
    potluck/<swarm>/coordinator/events           re-planned, recovered, peer joined / left, job done

Every payload is one JSON object carrying ``v`` (schema version), ``peer`` (the sender's peer id), ``at``
(unix seconds) and ``sig``: base64 of the sender's Ed25519 signature over the object's canonical JSON
without ``sig`` (sorted keys, no spaces). Anyone who can reach the broker can publish, so a reader
trusts a message only after ``open_message``: size, JSON, the topic's swarm and sender, the signature
(the key is inlined in the peer id; the coordinator's comes from the invite), then the schema. Unknown
fields are ignored, so later versions can add fields without breaking older readers.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from potluck.protocol.errors import IdentityError, RecordError
from potluck.protocol.identity import Identity, peer_id_from_public_key, public_key_from_peer_id, verify
from potluck.protocol.keys import check_swarm_id, mqtt_topic
from potluck.protocol.records import PeerId

VERSION = 1
MAX_PEER_MESSAGE_BYTES = 64 * 1024  # a peer's status, metrics or event
MAX_COORDINATOR_MESSAGE_BYTES = 1 << 20  # the plan and members of a swarm of a few thousand peers
MAX_LINKS = 64  # links one metrics message describes (this peer's measured ones)

Num = Annotated[float, Field(ge=0.0, le=1e18, allow_inf_nan=False)]
Text = Annotated[str, Field(max_length=500)]
PeerState = Literal[
    "joining",  # starting: probing its hardware, joining the DHT, waiting for a plan
    "syncing",  # placed: taking its stage's state before the first step
    "contributing",  # placed and committing steps
    "spare",  # in the swarm, not placed (the status message says why)
    "stale",  # placed, but no step committed for a while
    "unreachable",  # it cannot reach the swarm (no coordinator or peer seen)
    "leaving",  # handing its work over before it exits
    "offline",  # gone: its last will, or its goodbye
]
EventKind = Literal[
    "joined",  # a peer: it is in the swarm (hardware probed, heartbeat up)
    "placed",  # a peer: a plan gave it a stage and a replica
    "spare",  # a peer: a plan left it out, and why
    "state_received",  # a peer: it took its stage's state (bytes, seconds, from where)
    "step_aborted",  # a peer: a step it ran was not committed, and why
    "left",  # a peer: it leaves (gracefully)
    "replanned",  # the coordinator: a new plan epoch, and why
    "recovered",  # the coordinator: the first committed step after a re-plan that followed a failure
    "peer_joined",  # the coordinator: a peer's heartbeat appeared
    "peer_left",  # the coordinator: a peer's heartbeat expired or it left
    "job_done",
    "job_failed",
]


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    v: int = Field(ge=1, le=1000)
    peer: PeerId  # the sender
    at: float = Field(ge=0.0, le=1e11)  # unix seconds when it was signed


class StepTimes(BaseModel):
    """Where one step's seconds went (as in the progress records)."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    compute: Num = 0.0
    send: Num = 0.0
    recv: Num = 0.0
    allreduce: Num = 0.0
    idle: Num = 0.0
    total: Num = 0.0
    round_trip: Num = 0.0  # per micro-batch: activations sent -> their gradient back (StepTiming)
    hold: Num = 0.0  # per micro-batch: activations in -> their gradient sent


class LinkRate(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    mb_s: Num  # measured goodput towards the peer, MB/s
    rtt_ms: Num


class PeerStatus(_Message):
    """What a peer is doing now (retained, so a dashboard that starts later sees every peer at once)."""

    state: PeerState
    job: str | None = Field(default=None, max_length=64)
    epoch: int | None = Field(default=None, ge=0)
    stage: int | None = Field(default=None, ge=0, le=4096)
    replica: int | None = Field(default=None, ge=0, le=4096)
    step: int = Field(default=0, ge=0)
    device: Text = ""  # e.g. "cpu: AMD EPYC" or "cuda: NVIDIA RTX 3060"
    tflops: Num = 0.0  # its measured fp32 TFLOP/s
    joined_at: float = Field(default=0.0, ge=0.0, le=1e11)
    message: Text = ""  # why (spare reason, last failure)
    last_abort: Text = ""  # the last step of its that was not committed, and why


class PeerMetrics(_Message):
    """A peer's numbers, every few seconds while it runs."""

    state: PeerState
    epoch: int | None = Field(default=None, ge=0)
    stage: int | None = Field(default=None, ge=0, le=4096)
    replica: int | None = Field(default=None, ge=0, le=4096)
    step: int = Field(default=0, ge=0)
    loss: float | None = Field(default=None, ge=-1e6, le=1e6)  # the swarm's loss of its last step
    tokens_per_s: Num = 0.0
    timing: StepTimes = StepTimes()
    bytes_sent_per_step: int = Field(default=0, ge=0)
    bytes_sent: int = Field(default=0, ge=0)  # since it joined, all streams
    bytes_received: int = Field(default=0, ge=0)
    links: dict[PeerId, LinkRate] = Field(default_factory=dict, max_length=MAX_LINKS)
    bytes_per_link: dict[PeerId, int] = Field(
        default_factory=dict, max_length=MAX_LINKS
    )  # sent to each, total
    codec_ratio: dict[Literal["activations", "gradients"], Num] = Field(default_factory=dict)  # raw / wire
    memory_bytes: int = Field(default=0, ge=0)  # resident memory of the process
    device_memory_bytes: int = Field(default=0, ge=0)  # accelerator memory in use
    steps_contributed: int = Field(default=0, ge=0)  # committed steps it took part in since it joined
    tokens_contributed: int = Field(default=0, ge=0)  # its share of those steps' tokens
    flops_contributed: Num = 0.0  # estimated, from its layers and its tokens


class Event(_Message):
    """Something happened; ``data`` holds a few numbers or short strings about it."""

    kind: EventKind
    detail: Text = ""
    data: dict[str, float | int | str | None] = Field(default_factory=dict, max_length=16)


class StageView(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    first_layer: int = Field(ge=0)
    last_layer: int = Field(ge=1)  # exclusive
    peers: list[PeerId] = Field(max_length=4096)


class JobShareView(BaseModel):
    """One job on a swarm of several (docs/multijob.md): its lease and shares of the allocation."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    job: str = Field(max_length=64)
    own: bool = False  # the swarm's own job (its coordinator's)
    weight: Num = 1.0
    step: int = Field(default=0, ge=0)
    steps: int = Field(default=0, ge=0)
    peers: list[PeerId] = Field(default_factory=list, max_length=4096)  # leased this round
    allocation: Num = 0.0  # the policy's time fraction, summed over peer classes
    received: Num = 0.0  # the share of its time it has held peers so far, summed over classes


class MemberView(BaseModel):
    """A peer with a valid heartbeat in the DHT, as the coordinator verified it."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    device: Text = ""
    tflops: Num = 0.0
    memory_bytes: int = Field(default=0, ge=0)


class CoordinatorStatus(_Message):
    """The job and its plan; ``members`` are the peers the dashboard may show (valid swarm records)."""

    job: str = Field(max_length=64)
    state: Literal["waiting", "training", "done", "failed"]
    steps: int = Field(ge=0)  # the job's last step
    step: int = Field(default=0, ge=0)  # steps the whole swarm completed
    loss: float | None = Field(default=None, ge=-1e6, le=1e6)  # the newest step's loss
    tokens_per_s: Num = 0.0  # the swarm's since the first step observed (``telemetry.summary``)
    eta_s: Num | None = None  # seconds to the last step at that rate; None while it is unknown
    bytes_per_step: int = Field(default=0, ge=0)  # sent by all placed peers in one step
    epoch: int | None = Field(default=None, ge=0)
    start_step: int = Field(default=0, ge=0)
    stages: list[StageView] = Field(default_factory=list, max_length=1024)
    spares: dict[PeerId, Text] = Field(default_factory=dict, max_length=4096)
    members: dict[PeerId, MemberView] = Field(default_factory=dict, max_length=4096)
    reason: Text = ""
    # Several jobs on one swarm: every job and its shares (empty on a one-job swarm), the lease round
    jobs: list[JobShareView] = Field(default_factory=list, max_length=256)
    lease_round: int | None = Field(default=None, ge=0)
    lease_end: Num | None = None


class LinkView(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    src: PeerId
    dst: PeerId
    mb_s: Num
    rtt_ms: Num
    measured: bool  # False: the planner's estimate


class CoordinatorLinks(_Message):
    links: list[LinkView] = Field(default_factory=list, max_length=16384)


Kind = Literal["status", "metrics", "events", "links"]
_PEER_KINDS: dict[str, type[_Message]] = {"status": PeerStatus, "metrics": PeerMetrics, "events": Event}
_COORDINATOR_KINDS: dict[str, type[_Message]] = {
    "status": CoordinatorStatus,
    "links": CoordinatorLinks,
    "events": Event,
}


def peer_topic(swarm_id: str, peer_id: str, kind: Kind) -> str:
    return mqtt_topic(swarm_id, "peer", peer_id, kind)


def coordinator_topic(swarm_id: str, kind: Kind) -> str:
    return mqtt_topic(swarm_id, "coordinator", kind)


def swarm_filter(swarm_id: str) -> str:
    """The subscription that receives everything of one swarm."""
    return mqtt_topic(swarm_id, "#")


def canonical(obj: dict[str, Any]) -> bytes:
    """The bytes a signature covers: the object without ``sig``, sorted keys, no spaces, no NaN."""
    body = {k: v for k, v in obj.items() if k != "sig"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def seal_message(identity: Identity, message: _Message) -> bytes:
    """The signed JSON payload of ``message`` (whose ``peer`` must be ``identity``'s)."""
    if message.peer != identity.peer_id:
        raise RecordError(f"telemetry message names peer {message.peer}, signed by {identity.peer_id}")
    obj = message.model_dump(mode="json")
    obj["sig"] = base64.b64encode(identity.sign(canonical(obj))).decode("ascii")
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


def open_message(topic: str, payload: bytes, swarm_id: str, coordinator_key: bytes | None = None) -> _Message:
    """The verified message of ``topic``; ``RecordError`` for anything malformed, oversized, of another
    swarm, forged or unsigned. A coordinator message needs ``coordinator_key`` (from the invite)."""
    check_swarm_id(swarm_id)
    parts = topic.split("/")
    if len(parts) < 4 or parts[0] != "potluck" or parts[1] != swarm_id:
        raise RecordError(f"topic {topic[:120]!r} is not of swarm {swarm_id}")
    if parts[2] == "peer" and len(parts) == 5 and parts[4] in _PEER_KINDS:
        model, limit, sender = _PEER_KINDS[parts[4]], MAX_PEER_MESSAGE_BYTES, parts[3]
        try:
            key = public_key_from_peer_id(sender)
        except IdentityError as e:
            raise RecordError(f"topic {topic[:120]!r}: {e}") from None
    elif parts[2] == "coordinator" and len(parts) == 4 and parts[3] in _COORDINATOR_KINDS:
        if coordinator_key is None:
            raise RecordError("a coordinator message cannot be checked without the coordinator's key")
        model, limit, key = _COORDINATOR_KINDS[parts[3]], MAX_COORDINATOR_MESSAGE_BYTES, coordinator_key
        sender = peer_id_from_public_key(key)
    else:
        raise RecordError(f"topic {topic[:120]!r} is not a potluck telemetry topic")
    if len(payload) > limit:
        raise RecordError(f"{topic}: {len(payload)} bytes, over the {limit} byte limit")
    try:
        obj = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RecordError(f"{topic}: payload is not JSON") from None
    if not isinstance(obj, dict):
        raise RecordError(f"{topic}: payload is not a JSON object")
    if obj.get("peer") != sender:
        raise RecordError(f"{topic}: payload names peer {str(obj.get('peer'))[:60]}, the topic {sender}")
    sig = obj.get("sig")
    try:
        signature = base64.b64decode(sig, validate=True) if isinstance(sig, str) else b""
        signed = canonical(obj)
    except (binascii.Error, ValueError):
        raise RecordError(f"{topic}: malformed signature or payload") from None
    if not verify(key, signed, signature):
        raise RecordError(f"{topic}: bad or missing signature")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise RecordError(f"{topic}: field {where}: {first['msg']}") from None
