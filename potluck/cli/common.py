"""Options and helpers shared by the subcommands."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from potluck.net.config import NetworkConfig
from potluck.protocol.errors import ProtocolError
from potluck.protocol.identity import write_private
from potluck.protocol.invite import Invite, read_invite

if TYPE_CHECKING:
    from potluck.protocol.membership import PeerView

# Markup off: what potluck prints quotes peers' messages and addresses ("[/ip4/...]"), which rich would
# read as tags (one crashed a peer). The few styled lines ask for markup and escape what they insert.
err_console = Console(stderr=True, markup=False)

HOST_MADDRS_HELP = "Multiaddrs to listen on, e.g. /ip4/0.0.0.0/tcp/31337 (repeatable)."
REACHABILITY = ("auto", "public", "private")
REACHABILITY_HELP = (
    "Can others dial this machine? auto: let libp2p find out; private: behind a NAT without port "
    "forwarding (reachable through relays, dials public peers itself); public: a reachable address "
    "(also relays for NATed peers)."
)
RELAY_HELP = (
    "With --reachability private: a relay to reserve a slot on, /.../p2p/ID (default: the bootstrap peers)."
)
ANNOUNCE_HELP = "Public multiaddrs others should dial (behind NAT or port forwarding; repeatable)."


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a one-line (or few-line) actionable error and return the exit to raise."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True, markup=True)
    return typer.Exit(code)


def parse_invite(arg: str) -> Invite:
    try:
        return read_invite(arg)
    except ProtocolError as e:
        raise fail(str(e)) from None


def network_config(
    host_maddrs: list[str] | None,
    announce_maddrs: list[str] | None,
    default_host: str,
    bootstrap_timeout_s: float,
    use_auto_relay: bool = False,
    reachability: str = "auto",
    relays: list[str] | None = None,
) -> NetworkConfig:
    if reachability not in REACHABILITY:
        raise fail(f"--reachability must be one of {', '.join(REACHABILITY)}, not {reachability!r}")
    bad = [r for r in relays or () if "/p2p/" not in r]
    if bad:
        raise fail(f"a --relay address must end in /p2p/<relay peer id>: {bad[0]}")
    return NetworkConfig(
        host_maddrs=tuple(host_maddrs or [default_host]),
        announce_maddrs=tuple(announce_maddrs or ()),
        bootstrap_timeout_s=bootstrap_timeout_s,
        use_auto_relay=use_auto_relay,
        reachability=reachability,  # type: ignore[arg-type]  # checked above
        relays=tuple(relays or ()),
    )


def peers_table(peers: list[PeerView], now: float, title: str) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("peer", no_wrap=True)
    table.add_column("device", no_wrap=True, max_width=24)
    for col in ("mem GiB", "free GiB", "fp32 TF/s", "bf16 TF/s", "heartbeat"):
        table.add_column(col, justify="right", no_wrap=True)
    for p in peers:
        hw = p.record.hardware
        table.add_row(
            "…" + p.peer_id[-8:],
            hw.label,
            f"{hw.memory_total_bytes / 2**30:.1f}",
            f"{hw.memory_free_bytes / 2**30:.1f}",
            f"{hw.tflops_fp32:.3f}",
            f"{hw.tflops_bf16:.3f}",
            f"{p.age_s(now):.1f}s",
        )
    return table


def write_private_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by the owner only (an invite may carry a join token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, (text + "\n").encode())
