"""``potluck launch``: start a coordinator for a job and print the invite."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from potluck.aio import bounded, stop_on_signals
from potluck.cli.common import (
    ANNOUNCE_HELP,
    HOST_MADDRS_HELP,
    REACHABILITY_HELP,
    err_console,
    fail,
    network_config,
    parse_invite,
    peers_table,
    write_private_text,
)
from potluck.cli.telemetry_opts import (
    DASHBOARD_HELP,
    MQTT_BIND_HELP,
    MQTT_URL_HELP,
    TelemetryOptions,
    TelemetryStack,
)
from potluck.cli.views.job import JobWatcher
from potluck.cli.views.model import job_lines
from potluck.coordinator.config import DEFAULT_HOME, AdmitConfig, AllocatorConfig, CoordinatorConfig
from potluck.coordinator.memory import unfinished_swarm
from potluck.errors import PotluckError, TaskFailed
from potluck.protocol.errors import ProtocolError
from potluck.protocol.invite import Invite
from potluck.protocol.jobspec import JobSpec, owner_path
from potluck.protocol.keys import check_swarm_id

if TYPE_CHECKING:
    from potluck.coordinator.service import CoordinatorService

STOP_TIMEOUT_S = 10.0  # bound on stopping the service's loops and its DHT node


def launch(
    job_file: Path = typer.Argument(..., help="Job file (TOML), e.g. examples/tiny.toml."),
    invite_file: Path = typer.Option(
        None, "--invite-file", help="Also write the invite to this file (0600)."
    ),
    swarm_id: str = typer.Option(
        None,
        "--swarm-id",
        help="Swarm id; default: the swarm of this job's unfinished run with this key, else job name + "
        "random suffix.",
    ),
    new_swarm: bool = typer.Option(
        False, "--new-swarm", help="Start a new swarm even if this job's last run did not finish."
    ),
    identity: Path = typer.Option(
        None,
        help="Coordinator's Ed25519 key file (default ~/.potluck/coordinator.pem; with --join "
        "~/.potluck/job-owner.pem).",
    ),
    join: str = typer.Option(
        None,
        "--join",
        help="Add this job to the running swarm of this invite (or @FILE) instead of starting a swarm.",
    ),
    weight: float = typer.Option(
        1.0, "--weight", min=0.001, max=1000.0, help="The job's priority weight on a swarm of several jobs."
    ),
    lease_seconds: float = typer.Option(
        300.0, "--lease-seconds", min=1.0, help="Allocation round: a job's peers change only at its end."
    ),
    alloc_policy: str = typer.Option(
        "max_min", "--alloc-policy", help="Allocation policy: max_min, las, makespan, max_throughput, fifo."
    ),
    alloc_classes: str = typer.Option(
        "fine",
        "--alloc-classes",
        help="Peer classes: fine (device, TFLOP/s, memory, uplink tiers) or device (device model only).",
    ),
    host_maddrs: list[str] = typer.Option(None, "--host-maddrs", help=HOST_MADDRS_HELP),
    announce_maddrs: list[str] = typer.Option(None, "--announce-maddrs", help=ANNOUNCE_HELP),
    reachability: str = typer.Option("auto", "--reachability", help=REACHABILITY_HELP),
    initial_peers: list[str] = typer.Option(None, "--initial-peers", help="Join an existing DHT instead."),
    poll_interval: float = typer.Option(2.0, min=0.2, help="Seconds between reads of the swarm state."),
    join_margin: float = typer.Option(
        1.5,
        "--join-margin",
        min=0.0,
        help="Place a peer that joins mid-run once the predicted seconds saved beat this many times "
        "the move's cost (restart + state download); lower places newcomers sooner.",
    ),
    as_json: bool = typer.Option(False, "--json", help="When the job ends, print a one-line JSON summary."),
    membership_only: bool = typer.Option(
        False, "--membership-only", help="Track peers but do not plan or train (a swarm to inspect)."
    ),
    checkpoint_copy: bool = typer.Option(
        True,
        "--checkpoint-copy/--no-checkpoint-copy",
        help="Pull each complete checkpoint from the peers into the job's checkpoint.dir.",
    ),
    copy_rate: float = typer.Option(
        20.0, "--copy-rate", min=0.0, help="MB/s the checkpoint copy may take (0: no cap)."
    ),
    telemetry: bool = typer.Option(
        True, "--telemetry/--no-telemetry", help="MQTT telemetry and the dashboard."
    ),
    mqtt_url: str = typer.Option(None, "--mqtt-url", help=MQTT_URL_HELP),
    mqtt_bind: str = typer.Option("127.0.0.1:0", "--mqtt-bind", help=MQTT_BIND_HELP),
    mqtt_ca: str = typer.Option(None, "--mqtt-ca", help="CA bundle to check an mqtts:// broker against."),
    dashboard_bind: str = typer.Option("127.0.0.1:8470", "--dashboard-bind", help=DASHBOARD_HELP),
    open_swarm: bool = typer.Option(
        False, "--open", help="Admit any peer that asks (no join token); bans and every check still hold."
    ),
    token_uses: int = typer.Option(
        0,
        "--token-uses",
        min=0,
        help="Peers the printed invite admits (0: any number); see `potluck invite`.",
    ),
    token_days: float = typer.Option(
        30.0, "--token-days", min=0.001, help="Days the invite's token is valid."
    ),
) -> None:
    """Coordinate a job: sign it, print an invite, plan the peers that join, train to the last step.
    With --join, add the job to a running swarm: the swarm's coordinator leases it peers."""
    invite = parse_invite(join) if join is not None else None
    identity = identity or DEFAULT_HOME / ("job-owner.pem" if invite is not None else "coordinator.pem")
    if alloc_policy not in ("max_min", "las", "makespan", "max_throughput", "fifo"):
        raise fail(f"unknown --alloc-policy {alloc_policy!r}")
    if alloc_classes not in ("fine", "device"):
        raise fail(f"unknown --alloc-classes {alloc_classes!r}: fine or device")
    from potluck.coordinator.job.codecs import chain_problems  # torch: only once the command runs
    from potluck.model.hub.config import load_job_file

    try:
        job = load_job_file(job_file)
        if problems := chain_problems(job.compression):
            raise fail(f"job file {job_file}: " + "; ".join(problems))
        if invite is not None:
            swarm = invite.swarm_id
        else:
            swarm = check_swarm_id(swarm_id or _swarm_id(job, identity, new_swarm))
    except ProtocolError as e:
        raise fail(str(e)) from None
    alloc = AllocatorConfig(
        policy=alloc_policy,  # type: ignore[arg-type]  # checked above
        round_s=lease_seconds,
        classes=alloc_classes,  # type: ignore[arg-type]
        weight=weight,
        ttl_s=min(max(10.0, 2 * lease_seconds), 3600.0),  # a restart within it carries on
    )
    cfg = CoordinatorConfig(
        swarm_id=swarm,
        identity_path=identity,
        net=network_config(
            host_maddrs, announce_maddrs, "/ip4/0.0.0.0/tcp/0", 30.0, reachability=reachability
        ),
        initial_peers=tuple(initial_peers or ()),
        poll_interval_s=poll_interval,
        join_margin=join_margin,
        train=not membership_only,
        copy_checkpoints=checkpoint_copy,
        copy_rate_mb_s=copy_rate,
        admit=AdmitConfig(open=open_swarm),
        token_uses=token_uses,
        token_ttl_s=token_days * 86400.0,
        alloc=alloc,
        remember=invite is None,  # a joined job's coordinator rejoins through the invite
    )
    if invite is not None:  # the swarm's broker carries the peers' telemetry; no dashboard of its own
        telemetry = False
    if cfg.train:
        job, cfg = _owner_files(job, job_file, cfg)
    stack = TelemetryStack(TelemetryOptions(telemetry, mqtt_url, mqtt_bind, dashboard_bind, mqtt_ca))
    try:
        asyncio.run(_run(cfg, job, stack, invite_file, as_json, invite))
    except ProtocolError as e:
        raise fail(str(e)) from None
    except TaskFailed as e:  # its traceback is in the log already
        raise fail(str(e), code=1) from None


def _owner_files(job: JobSpec, job_file: Path, cfg: CoordinatorConfig) -> tuple[JobSpec, CoordinatorConfig]:
    """What the job owner's machine prepares before the job is signed, under its checkpoint directory:
    a model ``from`` a Hugging Face directory as step 0 (model/hub/convert.py), and a data directory
    as a shipped corpus, its fingerprint in the job (model/corpus/ship.py); the coordinator serves both."""
    from potluck.model.corpus.ship import job_tokenizer, keep_tokenizer, ship_data
    from potluck.model.hub.convert import pretrained_checkpoint
    from potluck.model.hub.read import WEIGHTS_MEMO, weights_digest

    root = cfg.checkpoint_root or Path(job.checkpoint.dir).expanduser()
    try:
        job = job_tokenizer(job, job_file.parent)
        job, corpus = ship_data(job, job_file.parent, root / "corpus")
        keep_tokenizer(job, job_file.parent, root)  # beside the checkpoints: generate and export find it
        if job.model.pretrained:
            assert job.model.from_dir is not None  # pretrained: it comes from a directory
            directory = owner_path(job_file.parent, job.model.from_dir)
            model = job.model.model_copy(
                update={"weights_sha256": weights_digest(directory, root / WEIGHTS_MEMO)}
            )
            job = job.model_copy(update={"model": model})
            if (written := pretrained_checkpoint(job, directory, root)) is not None:
                err_console.print(
                    f"step 0 from {escape(str(directory))}: {escape(str(written))}", markup=True
                )
    except (PotluckError, OSError) as e:
        raise fail(f"job file {job_file}: {e}") from None
    if corpus is not None:
        m = corpus.manifest
        err_console.print(
            f"data: {m.documents:,} documents, {m.tokens:,} tokens in {len(m.shards)} shards, shipped to "
            f"the peers (fingerprint {m.fingerprint[:12]})"
        )
        cfg = dataclasses.replace(cfg, corpus=corpus.blobs)
    return job, cfg


def _swarm_id(job: JobSpec, identity: Path, new_swarm: bool) -> str:
    """The swarm of this job's unfinished run coordinated with this key (a restart carries on with it),
    unless ``new_swarm``; else a new id."""
    unfinished = None if new_swarm else unfinished_swarm(identity, job.name)
    if unfinished is not None:
        err_console.print(
            f"carrying on with swarm [bold]{escape(unfinished)}[/]: the last run of job {escape(job.name)} "
            "did not finish (--new-swarm starts afresh)",
            markup=True,
        )
        return unfinished
    return _default_swarm_id(job)


def _default_swarm_id(job: JobSpec) -> str:
    base = "".join(c if c.isalnum() else "-" for c in job.name.lower()).strip("-")[:50] or "swarm"
    return f"{base}-{secrets.token_hex(3)}"


async def _run(
    cfg: CoordinatorConfig,
    job: JobSpec,
    stack: TelemetryStack,
    invite_file: Path | None,
    as_json: bool,
    join: Invite | None = None,
) -> None:
    """Report joins and leaves, and serve until the job ends or SIGINT / SIGTERM arrives."""
    from potluck.coordinator.joined import JoinedJobService
    from potluck.coordinator.service import CoordinatorService

    mqtt = await stack.open_broker() if join is None else join.mqtt  # before the invite: it carries it
    cfg = dataclasses.replace(cfg, mqtt_url=mqtt)
    from potluck.classpar.swarm.service import ClassParJob, ClassParPlanPublished, with_data_digest
    from potluck.coordinator.events import PeersChanged

    service: CoordinatorService
    kinds = {"class_parallel": ClassParJob}  # docs/class-parallel.md; "pipeline" is built in
    if job.kind == "class_parallel":
        job = with_data_digest(job)
    if join is None:
        service = CoordinatorService(cfg, job, kinds=kinds)
    else:
        service = JoinedJobService(cfg, job, join, kinds=kinds)

    def show(event: object) -> None:
        if isinstance(event, PeersChanged):
            for pid in event.joined:
                err_console.print(f"+ peer joined: {pid}", highlight=False)
            for pid in event.left:
                err_console.print(f"- peer left:   {pid}", highlight=False)
            # hivemind's DHT time is the wall clock (hivemind.utils.get_dht_time is time.time)
            live = list(event.state.peers.values())
            err_console.print(peers_table(live, time.time(), f"{len(live)} live"))
        elif isinstance(event, ClassParPlanPublished):
            plan = event.plan
            err_console.print(
                f"class-parallel plan epoch {plan.epoch} ({plan.status}): {event.reason}", highlight=False
            )

    service.events.subscribe(show)
    try:
        with stop_on_signals() as stop:
            await _serve(service, stack, stop, invite_file, as_json)
    finally:
        await stack.stop()


async def _serve(
    service: CoordinatorService,
    stack: TelemetryStack,
    stop: asyncio.Event,
    invite_file: Path | None,
    as_json: bool,
) -> None:
    """Print the invite, follow the job until it ends or ``stop`` is set, then stop the service."""
    cfg, job = service.cfg, service.job
    invite = await service.start()
    try:
        await stack.start(service)
        if stack.dashboard_url:
            err_console.print(f"dashboard: {stack.dashboard_url}", highlight=False)
        if stack.target is not None:
            err_console.print(f"mqtt: {stack.target.url(with_password=False)}", highlight=False)
        text = invite.encode()
        if invite_file is not None:
            write_private_text(invite_file, text)
        if service.join is not None:
            err_console.print(
                f"job [bold]{escape(job.name)}[/] offered to swarm [bold]{escape(cfg.swarm_id)}[/] "
                f"(weight {cfg.alloc.weight:g}); its peers are leased by the swarm's coordinator",
                markup=True,
            )
        else:
            err_console.print(
                f"coordinator of swarm [bold]{escape(cfg.swarm_id)}[/] "
                f"for job [bold]{escape(job.name)}[/]; invite:",
                markup=True,
            )
            print(text, flush=True)  # noqa: T201 - the invite goes to stdout so it can be piped
            err_console.print(
                "peers join with:  potluck peer --join <invite>    (Ctrl-C stops the coordinator)"
            )
            for line in job_lines(job):  # what a volunteer joins (the same lines as `potluck status`)
                err_console.print(f"  {escape(line)}", markup=True, highlight=False)
        root = cfg.checkpoint_root or Path(job.checkpoint.dir).expanduser()
        with JobWatcher(job, root, service.throughput) as watcher:
            service.events.subscribe(watcher.handle)
            if service.plan is not None:  # a restart carries on with the plan the swarm follows
                watcher.on_plan(service.plan, service.last_reason)
            ended = asyncio.create_task(service.finished.wait())
            interrupted = asyncio.create_task(stop.wait())
            await asyncio.wait({ended, interrupted}, return_when=asyncio.FIRST_COMPLETED)
            ended.cancel()
            interrupted.cancel()
        if service.finished.is_set():
            service.save_memory()  # a plain relaunch of this job now starts a new swarm
            await _serve_other_jobs(service, stop)
    finally:
        await bounded(service.stop(), STOP_TIMEOUT_S, "stopping the coordinator")
    if service.error is not None:
        raise fail(service.error, code=1)
    if service.finished.is_set():
        err_console.print(f"job {job.name} done; final checkpoint: {watcher.checkpoint_path()}")
        if as_json:
            print(json.dumps(watcher.summary()), flush=True)  # noqa: T201 - machine-readable summary


async def _serve_other_jobs(service: CoordinatorService, stop: asyncio.Event) -> None:
    """The swarm's coordinator allocates its peers until the jobs added to it are done too; a joined
    job's coordinator tells the allocator its job is done."""
    if service.join is not None:
        await bounded(service.end_offer(), STOP_TIMEOUT_S, "withdrawing the job offer")
        return
    said: list[str] = []
    while service.allocator is not None and service.error is None and not stop.is_set():
        others = service.allocator.others_unfinished()
        if not others:
            return
        if others != said:
            err_console.print(f"serving the swarm on for job(s) {', '.join(others)}", highlight=False)
            said = others
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), service.cfg.poll_interval_s)


def register(app: typer.Typer) -> None:
    app.command("launch")(launch)
