"""The coordinator's one typed config."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from potluck.net.config import NetworkConfig
from potluck.protocol.allocation import PolicyLabel
from potluck.protocol.identity import DEFAULT_HOME


@dataclass(frozen=True)
class AdmitConfig:
    """The coordinator's door (``coordinator/admission.py``)."""

    open: bool = False  # admit any peer that asks (banned ones excepted)
    ttl_s: float = 7200.0  # an admission's life (past every record's TTL); peers renew it at half that
    timeout_s: float = 10.0  # bound on one admission conversation


@dataclass(frozen=True)
class AllocatorConfig:
    """Several jobs on one swarm (``coordinator/allocator.py``, docs/multijob.md)."""

    policy: PolicyLabel = "max_min"
    round_s: float = 300.0  # lease length: a job's peers change only at round ends
    handoff_s: float = 30.0  # what moving a peer between jobs costs, seconds of its work
    ttl_s: float = 60.0  # the Allocation record's lifetime; re-published every third of it
    # "fine": classes by device, TFLOP/s, memory and uplink tiers; "device": by device kind and model
    # only (a swarm of like machines whose start-up probes differ, e.g. processes sharing one CPU)
    classes: Literal["fine", "device"] = "fine"
    weight: float = 1.0  # the priority weight of the swarm's own job
    offer_ttl_s: float = 60.0  # a job owner's JobOffer lifetime; re-published every third of it


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
    corpus: Path | None = None  # the job's shipped corpus (model/corpus): blobs named by SHA-256, served
    train: bool = True  # plan and run the job (False: membership only, as before issue 6)
    link_wait_s: float = 15.0  # the first plan waits this long for link reports once enough peers are live
    max_backoff_s: float = 30.0  # cap on the doubling wait before re-planning after failed plans
    suspect_slack_s: float = 5.0  # a suspect's heartbeat may land this long after its interval
    suspect_probe_s: float = 2.0  # direct probe of a suspect: a failure confirms it without waiting
    # How often the daemon is asked which peers it is connected to (a local call, ~1 ms): a placed peer
    # whose connection went away is dialled at once (``probes.ConnectionWatch``). 0 turns the watch off.
    connection_watch_s: float = 0.5
    # Joining a running job (docs/training.md, "Joining a running job"): a newcomer is a spare at once;
    # placing it is priced (a planner search, ~2 s of CPU) at most every join_check_s seconds, and again
    # for the same newcomers after join_recheck_s; it pays when the predicted seconds saved over the
    # remaining steps beat join_margin x (join_restart_s + the slowest state download).
    join_check_s: float = 10.0
    join_recheck_s: float = 60.0
    join_restart_s: float = 5.0  # what a re-plan costs besides moving state: stop, rebuild, first step
    join_margin: float = 1.5
    # A re-plan nobody had to stop for (a graceful leave, placing a joiner) starts this many seconds of
    # steps ahead of the newest reported step, plus two polls: the time the plan takes to reach the peers
    # (pushed, it reaches them in well under a second; the polls cover a missed push and the reports'
    # age). Each second here is a second a newcomer waits for its first step (4.0 until 12-08).
    handoff_lead_s: float = 1.0
    # The job owner's copy (coordinator/copies.py): pull each complete checkpoint into checkpoint_root.
    copy_checkpoints: bool = True
    copy_rate_mb_s: float = 20.0  # MB/s the copy may take from the peers, summed over them (0: no cap)
    final_copy_timeout_s: float = 120.0  # at the job's end, wait this long for its last checkpoint copy
    # Restart (docs/training.md, "Coordinator restart"): rejoin through remembered peers, then recover.
    remember: bool = True  # keep peers' addresses and the last plan in <key dir>/<key stem>.swarms/
    rejoin_timeout_s: float = 10.0  # remembered peers only: none answering by then starts a new DHT
    recover_timeout_s: float = 60.0  # bound on reading the plan and progress left in the DHT
    recover_empty_reads: int = 3  # empty reads in a row (1 s apart) before "nothing to recover"
    recover_peers_s: float = 15.0  # wait for the recovered plan's placed peers' heartbeats this long
    mqtt_url: str | None = None  # the telemetry broker peers publish to (it travels in the invite)
    # Who may join (coordinator/admission.py): the invite's token admits peers; open: anyone who asks.
    admit: AdmitConfig = field(default_factory=AdmitConfig)
    token_uses: int = 0  # peers the printed invite's token admits (0: any number)
    token_ttl_s: float = 30 * 86400.0  # how long the printed invite's token can be traded
    bans_ttl_s: float = 600.0  # the signed ban list's lifetime; refreshed every third of it
    alloc: AllocatorConfig = field(default_factory=AllocatorConfig)
