"""The peer daemon's typed configs, one tree, no torch: the daemon's PeerConfig composes the network's
configs (``potluck.net.config``) and the training side's (worker -> trainer -> collectives).

Defaults are what a volunteer on a home connection wants, and each is written once: a config that
passes a value down to another takes that one's default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from potluck.net.config import LinkProbeConfig, NetworkConfig
from potluck.protocol.identity import DEFAULT_HOME
from potluck.protocol.invite import Invite
from potluck.protocol.jobspec import AggregationRule
from potluck.telemetry.config import TelemetryConfig
from potluck.transfer.pace import SERVE_SHARE


@dataclass(frozen=True)
class AllReduceConfig:
    """One tree or ring all-reduce (``peer.collectives.tree``)."""

    codec: str = "none"  # any potluck.compression spec; applied on every hop
    chunk_elements: int = 1 << 18  # elements moved per pipeline step, summed over all trees
    timeout_s: float = 30.0  # bound on each wait for a chunk
    average: bool = True  # mean over the group (else the sum)
    # Reduce chunks a peer may have sent up per tree before the broadcast of the chunk ``window`` back
    # has reached it (0: no limit). Unbounded, a peer hands its whole share to the transport at once and
    # the broadcast chunks everyone waits on queue behind that backlog on a capped uplink.
    window: int = 4
    # How a shard owner on a one-hop schedule combines the replicas' contributions (collectives/robust.py):
    # "mean", "trimmed_mean" (dropping ``trim`` of each side per coordinate) or "centered_clip".
    rule: AggregationRule = "mean"
    trim: float = 0.2


@dataclass(frozen=True)
class RelaxedConfig:
    """Partial participation (``peer.collectives.relaxed``)."""

    deadline_s: float = 10.0  # contributions not ready this long after the leader starts are dropped
    max_attempts: int = 3  # re-runs after a member fails mid-collective
    min_members: int = 1  # fewer contributors than this: the round fails for everyone


@dataclass(frozen=True)
class DiLoCoConfig:
    """Local steps with an outer step (``peer.collectives.diloco``)."""

    inner_steps: int = 32  # H: inner optimizer steps between syncs
    outer_lr: float = 0.7
    outer_momentum: float = 0.9  # Nesterov momentum of the outer SGD


@dataclass(frozen=True)
class TrainerConfig:
    """One stage's networked step (``peer.train.trainer``)."""

    device: str = "cpu"  # a torch device string, already resolved ("auto" is decided by the caller)
    # "auto": bf16 autocast of forward/backward on CUDA, fp32 elsewhere; "bf16": on any device; "fp32":
    # never. Master weights, gradients and AdamW state are fp32 whatever this says (model/device.py).
    precision: str = "auto"
    step_timeout_s: float = 120.0  # bound on each pipeline receive and on the commit
    allreduce_timeout_s: float = 60.0  # bound on each all-reduce chunk (and never above the step's)
    # Once a run measured a few steps, each wait gets factor x its slowest recent step, at least the
    # floor, at most step_timeout_s (peer.train.budget): a dead neighbour is noticed in seconds.
    timeout_floor_s: float = 15.0
    timeout_factor: float = 10.0
    chunk_elements: int = AllReduceConfig.chunk_elements  # all-reduce pipelining granularity
    bucket_elements: int = 1 << 17  # gradient bucket size (elements) for overlap with the backward
    overlap: bool = True  # start each bucket's all-reduce as soon as the backward finished it
    # How long the start barrier (train.barrier) waits for the slowest peer of a new plan to take its
    # state (from its memory, its disk or other peers). Seconds; covers the state hand-off of a small
    # model on a home link. Only the barrier waits this long: the first step runs under the step budget.
    start_wait_s: float = 60.0
    # How long a spot checker or an auditor waits for evidence pushed right after a step's commit
    # (train/spot.py, train/audit.py); an owner's audit evidence not in by then counts as withheld. An
    # owner's evidence is ~spot_checks of the upload its step takes anyway (1% at the default), so a
    # slow uplink sends it in a small share of a step; two minutes leave room for a slow step too.
    evidence_timeout_s: float = 120.0
    # Bytes this peer offers (``--max-memory``; None: no bound). A peer running two waves (tick-tock,
    # peer/train/waves.py) admits the second only when both fit within it at their staggered peak.
    max_memory_bytes: int | None = None


@dataclass(frozen=True)
class WorkerConfig:
    """The training side (``peer.worker``): how often it reads the plan and reports, how long it waits."""

    device: str = TrainerConfig.device  # resolved torch device string
    precision: str = TrainerConfig.precision
    plan_poll_s: float = 1.0  # how often the plan key is read
    progress_interval_s: float = 1.0  # least time between two progress records (the last is always sent)
    progress_ttl_s: float = 120.0
    step_timeout_s: float = TrainerConfig.step_timeout_s  # each pipeline receive and the step commit
    allreduce_timeout_s: float = TrainerConfig.allreduce_timeout_s
    # Everything this peer keeps between runs lives under its own state directory (no disk is shared
    # with anyone): checkpoints of job J under <state_dir>/checkpoints/J.
    state_dir: Path = DEFAULT_HOME / "peer"
    checkpoint_root: Path | None = None  # overrides <state_dir>/checkpoints/<job>
    # Where the job's data and tokenizer are on this machine (peer/data/paths.py): the volunteer's choice;
    # None: the names the job gives, under <state_dir>/data/
    data_dir: Path | None = None
    tokenizer: Path | None = None
    # Several jobs on one swarm: at most this long serving the job it leaves, until that job's next plan
    # is under way (peer/lease.py), before it follows the job its new lease names anyway
    move_timeout_s: float = 60.0
    max_memory_bytes: int | None = TrainerConfig.max_memory_bytes  # --max-memory, for the trainer
    # While it trains, the most of this peer's uplink serving state to others takes (--serve-share)
    serve_share: float = SERVE_SHARE

    def checkpoints(self, job: str, home: bool = True) -> Path:
        """Where this peer writes and keeps the checkpoints of ``job``: ``checkpoint_root`` names the
        swarm's own job's (``home``); another job's go beside it, in ``<checkpoint_root>.<job>``."""
        if self.checkpoint_root is None:
            return self.state_dir / "checkpoints" / job
        if home:
            return self.checkpoint_root
        return self.checkpoint_root.with_name(f"{self.checkpoint_root.name}.{job}")

    def trainer(self) -> TrainerConfig:
        """The trainer's config for this worker's device and bounds."""
        return TrainerConfig(
            self.device,
            self.precision,
            self.step_timeout_s,
            self.allreduce_timeout_s,
            max_memory_bytes=self.max_memory_bytes,
        )


@dataclass(frozen=True)
class PeerConfig:
    invite: Invite
    identity_path: Path = DEFAULT_HOME / "identity.pem"
    net: NetworkConfig = field(default_factory=NetworkConfig)
    links: LinkProbeConfig = field(default_factory=LinkProbeConfig)
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:1", "mps" (model/device.py checks it exists)
    precision: str = TrainerConfig.precision  # "auto" (bf16 autocast on CUDA), "bf16", "fp32"
    threads: int | None = None  # CPU threads torch may use (None: torch's default, all cores)
    # memory this peer offers the swarm (None: all that is free); on CUDA it also caps the allocator
    max_memory_bytes: int | None = None
    # Work slots offered on the device (docs/ticktock.md): 2 lets the coordinator give this peer two
    # replicas' shares, run as two staggered waves; the start-up probe then measures the pair speedup.
    slots: int = 1
    # Space sharing (``--share-device``, docs/multijob.md): the peer id of the co-tenant process this peer
    # runs on its device for a second job, or (in that co-tenant) the peer id of the device's own peer.
    cotenant: str | None = None
    cotenant_of: str | None = None
    # Two jobs' (or waves') throughput together over one's on this device, as its owner measured it (e.g.
    # under the real workloads); None: the start-up probe's matmul figure
    pair_speedup: float | None = None
    train: bool = True  # follow the coordinator's plan and train (False: membership and links only)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    ttl_s: float = 30.0  # heartbeat lifetime in the DHT; refreshed every third of it
    probe_budget_s: float = 0.5  # seconds per matmul benchmark at start-up
    withdraw_timeout_s: float = 2.0  # on shutdown: time allowed to store the "leaving" record
    # On SIGINT/SIGTERM: train and serve state on until the swarm's new plan without this peer is under
    # way, at most this long (a second signal leaves at once); then shutdown_timeout_s for the rest.
    leave_timeout_s: float = 60.0
    shutdown_timeout_s: float = 5.0  # on SIGINT/SIGTERM: everything is done within this, or forced
    # Leave once neither the coordinator nor any other peer has been visible (no libp2p connection, no
    # live heartbeat in the DHT) for this many seconds, instead of running on alone; None: never.
    swarm_gone_after_s: float | None = 120.0
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)  # MQTT status, metrics, events
    metrics_bind: tuple[str, int] | None = None  # serve Prometheus /metrics on (host, port); None: off

    @property
    def heartbeat_interval_s(self) -> float:
        return self.ttl_s / 3.0
