"""The peer daemon's one typed config. Defaults are what a volunteer on a home connection wants."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from potluck.net.config import LinkProbeConfig, NetworkConfig
from potluck.protocol.identity import DEFAULT_HOME
from potluck.protocol.invite import Invite


@dataclass(frozen=True)
class WorkerConfig:
    """The training side (``peer.worker``): how often it reads the plan and reports, how long it waits."""

    device: str = "cpu"  # resolved torch device string
    plan_poll_s: float = 1.0  # how often the plan key is read
    progress_interval_s: float = 1.0  # least time between two progress records (the last is always sent)
    progress_ttl_s: float = 120.0
    step_timeout_s: float = 120.0  # bound on each pipeline receive and on the step commit
    allreduce_timeout_s: float = 60.0
    checkpoint_root: Path | None = None  # overrides the job's checkpoint.dir


@dataclass(frozen=True)
class PeerConfig:
    invite: Invite
    identity_path: Path = DEFAULT_HOME / "identity.pem"
    net: NetworkConfig = field(default_factory=NetworkConfig)
    links: LinkProbeConfig = field(default_factory=LinkProbeConfig)
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:1", ...
    threads: int | None = None  # CPU threads torch may use (None: torch's default, all cores)
    max_memory_bytes: int | None = None  # memory this peer offers the swarm (None: all that is free)
    train: bool = True  # follow the coordinator's plan and train (False: membership and links only)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    ttl_s: float = 30.0  # heartbeat lifetime in the DHT; refreshed every third of it
    probe_budget_s: float = 0.5  # seconds per matmul benchmark at start-up
    withdraw_timeout_s: float = 2.0  # on shutdown: time allowed to store the "leaving" record
    shutdown_timeout_s: float = 5.0  # on SIGINT/SIGTERM: everything is done within this, or forced

    @property
    def heartbeat_interval_s(self) -> float:
        return self.ttl_s / 3.0
