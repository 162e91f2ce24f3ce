"""``potluck peer``: run the volunteer daemon."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from potluck.aio import dump_tasks_on, stop_on_signals
from potluck.cli import cotenant
from potluck.cli.common import (
    ANNOUNCE_HELP,
    HOST_MADDRS_HELP,
    REACHABILITY_HELP,
    RELAY_HELP,
    err_console,
    fail,
    network_config,
    parse_invite,
)
from potluck.errors import TaskFailed
from potluck.net.config import LinkProbeConfig
from potluck.peer import priority
from potluck.peer.config import PeerConfig, WorkerConfig
from potluck.peer.priority import START_NICE
from potluck.protocol.errors import AdmissionError, BootstrapError, IdentityError
from potluck.protocol.identity import DEFAULT_HOME
from potluck.telemetry.config import MqttTarget, TelemetryConfig
from potluck.telemetry.errors import TelemetryError

if TYPE_CHECKING:
    from rich.console import Console

    from potluck.peer.daemon import PeerDaemon
    from potluck.peer.telemetry import Snapshot


def peer(
    join: str = typer.Option(..., "--join", help="The invite printed by `potluck launch` (or @FILE)."),
    state_dir: Path = typer.Option(
        DEFAULT_HOME / "peer",
        "--state-dir",
        help="This peer's own directory: its key and checkpoints (shared with nobody).",
    ),
    identity: Path = typer.Option(
        None, help="Ed25519 key file; created if missing (default: STATE_DIR/identity.pem)."
    ),
    host_maddrs: list[str] = typer.Option(None, "--host-maddrs", help=HOST_MADDRS_HELP),
    announce_maddrs: list[str] = typer.Option(None, "--announce-maddrs", help=ANNOUNCE_HELP),
    device: str = typer.Option(
        "auto", help="auto (a GPU when there is one), cpu, cuda, cuda:N, mps; a missing one is an error."
    ),
    precision: str = typer.Option(
        "auto", help="auto (bf16 autocast on CUDA, fp32 elsewhere), bf16 or fp32 (weights stay fp32)."
    ),
    ttl: float = typer.Option(30.0, min=3.0, help="Heartbeat lifetime in seconds (refreshed every third)."),
    bootstrap_timeout: float = typer.Option(
        30.0, min=1.0, help="Seconds to keep trying the bootstrap peers."
    ),
    probe_seconds: float = typer.Option(0.5, min=0.0, help="Seconds per matmul benchmark at start-up."),
    use_auto_relay: bool = typer.Option(False, help="Behind NAT: become reachable through a libp2p relay."),
    reachability: str = typer.Option("auto", "--reachability", help=REACHABILITY_HELP),
    relay: list[str] = typer.Option(None, "--relay", help=RELAY_HELP),
    link_interval: float = typer.Option(120.0, min=1.0, help="Seconds between rounds of link measurement."),
    link_probe_bytes: int = typer.Option(
        4 << 20, min=1024, help="Bytes sent to measure each link's goodput."
    ),
    upload_mbps: float = typer.Option(
        None, min=0.001, help="Your upload, Mbit/s (your plan's figure): the planner keeps bulk sends off it."
    ),
    download_mbps: float = typer.Option(None, min=0.001, help="Your download, Mbit/s."),
    serve_share: float = typer.Option(
        WorkerConfig.serve_share,
        min=0.01,
        max=1.0,
        help="While you train, the most of your upload that serving state to other peers, or a replica sync "
        "running under the next steps, takes (1: no cap).",
    ),
    threads: int = typer.Option(None, min=1, help="CPU threads torch may use (default: all cores)."),
    max_memory: str = typer.Option(
        None, "--max-memory", help="Memory offered to the swarm, e.g. 6GB or 512MiB (default: all free)."
    ),
    slots: int = typer.Option(
        1,
        "--slots",
        min=1,
        max=2,
        help="Work slots on your device: 2 lets the swarm give you two replicas' shares, run as "
        "staggered tick-tock waves that share its memory (docs/ticktock.md).",
    ),
    share_device: bool = typer.Option(
        False,
        "--share-device",
        help="Let two jobs of a multi-job swarm share your device at once: starts a second peer process "
        "(its state under STATE_DIR/cotenant) that serves a second job only when the swarm leases "
        "your device to two jobs (docs/multijob.md).",
    ),
    pair_speedup: float = typer.Option(
        None,
        "--pair-speedup",
        min=0.01,
        max=2.0,
        help="Two jobs at once run at this x one job's throughput on your device (with --share-device or "
        "--slots 2); default: measured at start-up with a matmul probe.",
    ),
    cotenant_of: str = typer.Option(None, "--cotenant-of", hidden=True),
    train: bool = typer.Option(
        True, "--train/--no-train", help="Train when the coordinator places this peer."
    ),
    checkpoint_dir: Path = typer.Option(
        None,
        "--checkpoint-dir",
        help="Where this peer writes and reads checkpoints (default: STATE_DIR/checkpoints/JOB).",
    ),
    data_dir: Path = typer.Option(
        None,
        "--data-dir",
        help="Your copy of the job's data (a shipped job's: used when it is the job's corpus, else fetched).",
    ),
    tokenizer: Path = typer.Option(
        None, "--tokenizer", help="Your copy of the job's tokenizer.json (default: under STATE_DIR/data)."
    ),
    step_timeout: float = typer.Option(
        120.0, min=1.0, help="Seconds to wait for a pipeline neighbour or a step commit."
    ),
    swarm_gone_after: float = typer.Option(
        120.0, min=1.0, help="Leave after this many seconds with no coordinator or other peer visible."
    ),
    telemetry: bool = typer.Option(
        True, "--telemetry/--no-telemetry", help="Publish status, metrics and events to the swarm's broker."
    ),
    mqtt_url: str = typer.Option(
        None, "--mqtt-url", help="Publish telemetry to this broker instead of the one the invite names."
    ),
    mqtt_ca: str = typer.Option(None, "--mqtt-ca", help="CA bundle to check an mqtts:// broker against."),
    metrics_port: int = typer.Option(
        None, "--metrics-port", min=0, max=65535, help="Serve Prometheus /metrics on 127.0.0.1:PORT."
    ),
    metrics_host: str = typer.Option("127.0.0.1", "--metrics-host", help="Address /metrics listens on."),
    telemetry_interval: float = typer.Option(
        5.0, "--telemetry-interval", min=0.5, help="Seconds between two metrics messages."
    ),
    start_nice: int = typer.Option(
        START_NICE,
        "--start-nice",
        envvar="POTLUCK_START_NICE",
        min=0,
        max=19,
        help="CPU priority (nice) of the start-up (imports, probe, state fetch) so that it does not slow "
        "peers training on the same machine; back to normal once it trains (needs CAP_SYS_NICE, else "
        "it stays). 0: start at normal priority.",
    ),
) -> None:
    """Join a swarm with this machine: probe the hardware, announce it, keep a heartbeat."""
    priority.lower(start_nice)  # before torch and the daemons start threads and processes: they inherit it
    from potluck.classpar.swarm.peer import classpar_worker  # torch, hivemind: only once the command runs
    from potluck.peer.daemon import PeerDaemon

    _check_device(device, precision)
    invite = parse_invite(join)
    target = None
    if telemetry and (mqtt_url or invite.mqtt):
        try:
            target = MqttTarget.parse(mqtt_url or invite.mqtt or "", mqtt_ca)
        except TelemetryError as e:
            raise fail(str(e)) from None
    if share_device and cotenant_of is not None:
        raise fail("--share-device starts a co-tenant; a co-tenant starts none")
    cfg = PeerConfig(
        invite=invite,
        identity_path=identity or state_dir / "identity.pem",
        net=network_config(
            host_maddrs,
            announce_maddrs,
            "/ip4/0.0.0.0/tcp/0",
            bootstrap_timeout,
            use_auto_relay,
            reachability,
            relay,
        ),
        device=device,
        precision=precision,
        ttl_s=ttl,
        probe_budget_s=probe_seconds,
        links=LinkProbeConfig(
            interval_s=link_interval,
            bulk_bytes=link_probe_bytes,
            upload_mbps=upload_mbps,
            download_mbps=download_mbps,
        ),
        threads=threads,
        max_memory_bytes=_parse_bytes(max_memory) if max_memory else None,
        slots=slots,
        cotenant_of=cotenant_of,
        pair_speedup=pair_speedup,
        train=train,
        worker=WorkerConfig(
            max_memory_bytes=_parse_bytes(max_memory) if max_memory else None,
            state_dir=state_dir,
            checkpoint_root=checkpoint_dir,
            data_dir=data_dir,
            tokenizer=tokenizer,
            step_timeout_s=step_timeout,
            serve_share=serve_share,
        ),
        swarm_gone_after_s=swarm_gone_after,
        telemetry=TelemetryConfig(target=target, interval_s=telemetry_interval),
        metrics_bind=(metrics_host, metrics_port) if metrics_port is not None else None,
    )
    child = None
    try:
        if share_device:
            cfg, child = _start_cotenant(cfg, state_dir, checkpoint_dir)
        asyncio.run(_run(PeerDaemon(cfg, kinds={"class_parallel": classpar_worker}), child))
    except (BootstrapError, IdentityError, AdmissionError) as e:
        raise fail(str(e)) from None
    except TaskFailed as e:  # its traceback is in the log already
        raise fail(str(e), code=1) from None
    finally:
        cotenant.reap(child, cfg.leave_timeout_s + cfg.shutdown_timeout_s)


def _start_cotenant(
    cfg: PeerConfig, state_dir: Path, checkpoint_dir: Path | None
) -> tuple[PeerConfig, subprocess.Popen[bytes]]:
    """Start the co-tenant of ``--share-device`` (cli/cotenant.py); this peer's config names it."""
    from potluck.protocol.identity import Identity

    own = Identity.load_or_create(cfg.identity_path)
    root = cotenant.prepare(state_dir)
    other = Identity.load_or_create(root / "identity.pem")
    args = cotenant.cotenant_argv(sys.argv[1:], state_dir, own.peer_id, checkpoint_dir)
    return dataclasses.replace(cfg, cotenant=other.peer_id), cotenant.spawn(args)


def _check_device(device: str, precision: str) -> None:
    """Refuse a device that is not there (``--device cuda`` on a machine without a GPU) or a precision
    that does not exist before anything starts; torch loads here, in the command body only."""
    from potluck.model.device import PRECISIONS, resolve_device
    from potluck.model.errors import DeviceError

    if precision not in PRECISIONS:
        raise fail(f"--precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    try:
        resolve_device(device)
    except DeviceError as e:
        raise fail(str(e)) from None


_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def _parse_bytes(text: str) -> int:
    """'6GB', '512MiB', '1.5 GiB' or plain bytes -> bytes; a clear error otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else ""
    if m is None or unit not in _UNITS:
        raise fail(f"--max-memory {text!r}: use a size such as 6GB, 512MiB or 2000000000")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value < 1 << 20:
        raise fail(f"--max-memory {text!r} is below 1 MiB; no stage fits in that")
    return value


async def _run(daemon: PeerDaemon, child: subprocess.Popen[bytes] | None = None) -> None:
    """Run the daemon until SIGINT or SIGTERM; say so once it has joined. A co-tenant (``child``) is
    asked to leave when this peer is, each signal passed on."""
    # Ctrl-C twice: leave now; kill -USR1 <pid>: log what every task waits on (a peer that seems stuck)
    daemon.telemetry.on_change = lambda snap: print_status(err_console, snap)
    with stop_on_signals(daemon.stop_event, again=daemon.leave_now), dump_tasks_on():
        task = asyncio.create_task(daemon.run(), name="peer")
        if child is not None:
            relay = asyncio.create_task(_pass_on(daemon, child), name="co-tenant")
            task.add_done_callback(lambda _: relay.cancel())
        ready = asyncio.create_task(daemon.ready.wait())
        await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if ready.done() and not task.done():
            hw = daemon.hardware
            assert hw is not None
            err_console.print(
                f"joined swarm [bold]{escape(daemon.cfg.invite.swarm_id)}[/] as peer {daemon.peer_id} "
                f"({escape(hw.label)}, {hw.tflops_fp32:.2f} TFLOP/s fp32); "
                "Ctrl-C to leave (it hands its work over first; twice: at once)",
                highlight=False,
                markup=True,
            )
        ready.cancel()
        await task


async def _pass_on(daemon: PeerDaemon, child: subprocess.Popen[bytes]) -> None:
    """Ask the co-tenant to leave when this peer is asked to, and once more when told to leave at once."""
    for event in (daemon.stop_event, daemon.leave_now):
        await event.wait()
        cotenant.signal_leave(child)


def register(app: typer.Typer) -> None:
    app.command("peer")(peer)


def print_status(console: Console, snap: Snapshot) -> None:
    """Print the status line as it is: markup off, since it quotes other peers' error messages (a
    "[/ip4/...]" in one crashed a peer when rich read it as a closing tag) and its own "[state]"."""
    console.print(status_line(snap), highlight=False, markup=False)


def status_line(snap: Snapshot) -> str:
    """The volunteer's answer to "is my node contributing?", printed whenever it changes."""
    s, m = snap.status, snap.metrics
    where = f"stage {s.stage}, replica {s.replica} of plan epoch {s.epoch}" if s.stage is not None else ""
    parts = [f"[{s.state}]", where, f"step {s.step}" if s.stage is not None else ""]
    if m.tokens_contributed:
        parts.append(f"contributed {m.tokens_contributed:,} tokens ({m.flops_contributed / 1e12:,.1f} TFLOP)")
    if m.links:
        rates = sorted(link.mb_s for link in m.links.values())
        parts.append(f"links {rates[0]:.1f}-{rates[-1]:.1f} MB/s")
    if s.message and s.state != "contributing":
        parts.append(s.message)
    if s.last_abort:
        parts.append(f"last aborted: {s.last_abort}")
    return "  ".join(p for p in parts if p)
