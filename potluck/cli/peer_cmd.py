"""``potluck peer``: run the volunteer daemon."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from potluck.cli.common import (
    ANNOUNCE_HELP,
    HOST_MADDRS_HELP,
    err_console,
    fail,
    network_config,
    parse_invite,
)
from potluck.peer.config import DEFAULT_HOME, PeerConfig
from potluck.peer.daemon import PeerDaemon
from potluck.peer.links import LinkProbeConfig
from potluck.protocol.errors import BootstrapError, IdentityError


def peer(
    join: str = typer.Option(..., "--join", help="The invite printed by `potluck launch` (or @FILE)."),
    identity: Path = typer.Option(
        DEFAULT_HOME / "identity.pem", help="Ed25519 key file; created if missing."
    ),
    host_maddrs: list[str] = typer.Option(None, "--host-maddrs", help=HOST_MADDRS_HELP),
    announce_maddrs: list[str] = typer.Option(None, "--announce-maddrs", help=ANNOUNCE_HELP),
    device: str = typer.Option("auto", help="auto, cpu, cuda, cuda:N, mps."),
    ttl: float = typer.Option(30.0, min=3.0, help="Heartbeat lifetime in seconds (refreshed every third)."),
    bootstrap_timeout: float = typer.Option(
        30.0, min=1.0, help="Seconds to keep trying the bootstrap peers."
    ),
    probe_seconds: float = typer.Option(0.5, min=0.0, help="Seconds per matmul benchmark at start-up."),
    use_auto_relay: bool = typer.Option(False, help="Behind NAT: become reachable through a libp2p relay."),
    link_interval: float = typer.Option(120.0, min=1.0, help="Seconds between rounds of link measurement."),
    link_probe_bytes: int = typer.Option(
        4 << 20, min=1024, help="Bytes sent to measure each link's goodput."
    ),
) -> None:
    """Join a swarm with this machine: probe the hardware, announce it, keep a heartbeat."""
    cfg = PeerConfig(
        invite=parse_invite(join),
        identity_path=identity,
        net=network_config(
            host_maddrs, announce_maddrs, "/ip4/0.0.0.0/tcp/0", bootstrap_timeout, use_auto_relay
        ),
        device=device,
        ttl_s=ttl,
        probe_budget_s=probe_seconds,
        links=LinkProbeConfig(interval_s=link_interval, bulk_bytes=link_probe_bytes),
    )
    try:
        asyncio.run(_run(cfg))
    except (BootstrapError, IdentityError) as e:
        raise fail(str(e)) from None


async def _run(cfg: PeerConfig) -> None:
    daemon = PeerDaemon(cfg)
    daemon.install_signal_handlers()
    task = asyncio.create_task(daemon.run(), name="peer")
    ready = asyncio.create_task(daemon.ready.wait())
    await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if ready.done() and not task.done():
        hw = daemon.hardware
        assert hw is not None
        err_console.print(
            f"joined swarm [bold]{cfg.invite.swarm_id}[/] as peer {daemon.peer_id} "
            f"({hw.device_kind}: {hw.device_name}, {hw.tflops_fp32:.2f} TFLOP/s fp32); Ctrl-C to leave",
            highlight=False,
        )
    ready.cancel()
    await task


def register(app: typer.Typer) -> None:
    app.command("peer")(peer)
