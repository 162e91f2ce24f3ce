"""``potluck demo``: a coordinator and four local peers train a small model on loopback, end to end.

The coordinator runs in this process (so the demo can draw its progress); every peer is a real
``potluck peer`` process with its own p2p daemon, found through the invite like any volunteer. The job
is embedded: a 4-layer byte-level model on the built-in arithmetic corpus, forced to 2 pipeline stages
x 2 data-parallel replicas so every mechanism runs (activations and gradients cross processes, replicas
all-reduce, steps commit). Peers are reaped by PID when it ends; if this process is SIGKILLed (the OOM
killer, a closed container) the kernel kills the peers and every p2pd daemon too (``potluck.lifeline``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from potluck.aio import bounded, stop_on_signals
from potluck.cli.common import err_console, fail, write_private_text
from potluck.cli.telemetry_opts import DASHBOARD_HELP, TelemetryOptions, TelemetryStack
from potluck.cli.views.job import JobWatcher
from potluck.coordinator.config import CoordinatorConfig
from potluck.net.config import NetworkConfig, Reachability
from potluck.protocol.errors import ProtocolError
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import JobSpec
from potluck.testbed.demojob import demo_job

if TYPE_CHECKING:
    from potluck.testbed.localswarm import Placement

STOP_TIMEOUT_S = 15.0  # bound on stopping the coordinator service when the demo ends


def demo(
    steps: int = typer.Option(300, min=1, max=100_000, help="Training steps."),
    as_json: bool = typer.Option(False, "--json", help="End with a one-line JSON summary on stdout."),
    run_dir: Path = typer.Option(None, "--run-dir", help="Keep keys, logs and checkpoints here."),
    timeout: float = typer.Option(1800.0, min=10.0, help="Give up after this many seconds."),
    threads: int = typer.Option(1, min=1, help="CPU threads per peer (4 peers share this machine)."),
    telemetry: bool = typer.Option(
        True, "--telemetry/--no-telemetry", help="MQTT telemetry and the dashboard."
    ),
    dashboard_bind: str = typer.Option("127.0.0.1:0", "--dashboard-bind", help=DASHBOARD_HELP),
) -> None:
    """Train a small model with a local swarm: 2 pipeline stages x 2 replicas, then print a summary."""
    run_dir = (run_dir or Path(tempfile.mkdtemp(prefix="potluck-demo-"))).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        job = demo_job(steps, run_dir / "checkpoints")
    except ProtocolError as e:
        raise fail(str(e)) from None
    opts = TelemetryOptions(telemetry, dashboard_bind=dashboard_bind)
    summary, _ = asyncio.run(run_local_job(job, run_dir, timeout, threads, opts))
    err_console.print(f"final checkpoint: {summary['checkpoint']}   (logs in {run_dir})")
    if summary["checkpoint"]:
        err_console.print(f'try:  potluck generate {summary["checkpoint"]} --prompt "ada adds 12 and 30"')
    if as_json:
        typer.echo(json.dumps(summary))


async def run_local_job(
    job: JobSpec,
    run_dir: Path,
    timeout: float,
    threads: int,
    telemetry: TelemetryOptions | None = None,
    placement: Placement | None = None,
    peer_extra: Callable[[int], tuple[str, ...]] | None = None,
    reachability: Reachability = "auto",
) -> tuple[dict[str, object], JobWatcher]:
    """Coordinator here, ``job.min_peers`` peer processes on loopback; train to the end, then stop all.
    ``telemetry``: the broker and dashboard to run (None: none, as benchmarks want). ``placement``: where
    each process runs and listens (``"coordinator"`` is this process: its listen address only);
    ``peer_extra(i)``: more flags for peer i (its declared access link, say). ``reachability``: the
    coordinator's (``NetworkConfig.reachability``; "public" makes it a relay for NATed peers).

    Returns the summary and the watcher (per-peer step timings, the plan) for benchmarks."""
    from potluck.coordinator.service import CoordinatorService  # hivemind, torch: only when run
    from potluck.testbed.localswarm import LocalSwarm, on_loopback

    placement = placement or on_loopback
    net = NetworkConfig(
        host_maddrs=(placement("coordinator")[1],), bootstrap_timeout_s=30.0, reachability=reachability
    )
    stack = TelemetryStack(telemetry or TelemetryOptions(enabled=False))
    mqtt = await stack.open_broker()  # before the invite, which carries its URL
    cfg = CoordinatorConfig(
        swarm_id="demo",
        identity_path=run_dir / "coordinator.pem",
        net=net,
        poll_interval_s=1.0,
        mqtt_url=mqtt,
    )
    service = CoordinatorService(cfg, job, Identity.load_or_create(cfg.identity_path))
    peer_args = (
        "--probe-seconds",
        "0.2",
        "--threads",
        str(threads),
        "--link-interval",
        "30",
        "--link-probe-bytes",
        "262144",
        "--device",
        "cpu",
    )
    start = time.monotonic()
    verbose = 1 if logging.getLogger().getEffectiveLevel() <= logging.INFO else 0
    # On SIGINT / SIGTERM the peers end too, never left orphaned.
    with (
        stop_on_signals() as stop,
        LocalSwarm(
            run_dir, run_dir / "unused.toml", "demo", peer_args, verbose=verbose, placement=placement
        ) as swarm,
    ):
        swarm.invite = await service.start()
        # Another terminal can watch or join: potluck monitor --join @RUN_DIR/invite.txt
        write_private_text(run_dir / "invite.txt", swarm.invite.encode())
        try:
            await stack.start(service)
            if stack.dashboard_url:
                err_console.print(f"dashboard: {stack.dashboard_url}", highlight=False)
            if stack.target is not None:
                err_console.print(f"mqtt: {stack.target.url(with_password=False)}", highlight=False)
            n = job.min_peers
            where = "127.0.0.1" if placement is on_loopback else "their places"
            err_console.print(f"coordinator up; starting {n} peers on {where} (logs in {run_dir})")
            for i in range(n):
                swarm.start_peer(f"peer{i}", *(peer_extra(i) if peer_extra else ()))
            with JobWatcher(job, Path(job.checkpoint.dir), service.throughput, bar=True) as watcher:
                service.events.subscribe(watcher.handle)
                while not service.finished.is_set():
                    await asyncio.sleep(0.5)
                    dead = [p.name for p in swarm.procs.values() if not p.alive()]
                    if dead:
                        tails = "\n".join(f"--- {n}\n{swarm.procs[n].tail(12)}" for n in dead)
                        raise fail(f"peer process(es) exited early: {dead}\n{tails}")
                    if stop.is_set():
                        raise fail("interrupted; stopping the peers", code=130)
                    if time.monotonic() - start > timeout:
                        raise fail(f"the demo did not finish within {timeout:.0f} s ({service.last_reason})")
                if service.error is not None:
                    raise fail(service.error, code=1)
                if service.plan is not None:
                    watcher.on_progress(service.plan, service.progress)
            watcher.swarm_state = service.state  # links measured meanwhile (benchmarks use them)
            summary = watcher.summary()
            summary["seconds"] = round(time.monotonic() - start, 1)
        finally:
            await bounded(stack.stop(), STOP_TIMEOUT_S, "stopping the telemetry")
            await bounded(service.stop(), STOP_TIMEOUT_S, "stopping the coordinator")
    return summary, watcher


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
