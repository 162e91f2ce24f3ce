"""The coordinator's one typed config."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from potluck.net.config import NetworkConfig
from potluck.protocol.identity import DEFAULT_HOME


@dataclass(frozen=True)
class CoordinatorConfig:
    swarm_id: str
    identity_path: Path = DEFAULT_HOME / "coordinator.pem"
    net: NetworkConfig = field(default_factory=NetworkConfig)
    initial_peers: tuple[str, ...] = ()  # join an existing DHT instead of starting a new one
    job_ttl_s: float = 300.0  # the signed JobSpec's lifetime; refreshed every third of it
    poll_interval_s: float = 2.0  # how often the swarm state is re-read from the DHT
    read_timeout_s: float = 10.0  # bound on one DHT read of the swarm state
    plan_ttl_s: float = 300.0  # the signed TrainPlan's lifetime; refreshed every third of it
    checkpoint_root: Path | None = None  # where the coordinator looks for checkpoints (job's dir if None)
    train: bool = True  # plan and run the job (False: membership only, as before issue 6)
    link_wait_s: float = 15.0  # the first plan waits this long for link reports once enough peers are live
    max_backoff_s: float = 30.0  # cap on the doubling wait before re-planning after failed plans
    suspect_slack_s: float = 5.0  # a suspect's heartbeat may land this long after its interval
    suspect_probe_s: float = 2.0  # direct probe of a suspect: a failure confirms it without waiting
