"""``potluck demo``: a coordinator and local peers on loopback, all real processes, shut down cleanly."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import typer
from hivemind.utils import get_dht_time
from rich.console import Console

from potluck.cli.common import err_console, fail, peers_table
from potluck.localswarm import LocalSwarm

# The embedded job: small enough for 2 CPU cores.
DEMO_JOB = """\
name = "demo"
seed = 0
steps = 50
min_peers = 3

[model]
n_layers = 4
d_model = 128
n_heads = 4
vocab_size = 256
seq_len = 128

[batch]
tokens_per_step = 8192
micro_batch_size = 8
"""


def demo(
    peers: int = typer.Option(3, min=1, max=16, help="How many local peers to start."),
    timeout: float = typer.Option(90.0, min=5.0, help="Seconds to wait for every peer to appear."),
    as_json: bool = typer.Option(False, "--json", help="End with a one-line JSON summary."),
    keep: Path = typer.Option(None, "--run-dir", help="Keep keys and logs in this directory."),
) -> None:
    """Start a coordinator and local peers on 127.0.0.1, show the swarm, and shut it all down."""
    run_dir = keep or Path(tempfile.mkdtemp(prefix="potluck-demo-"))
    job_file = run_dir / "demo.toml"
    run_dir.mkdir(parents=True, exist_ok=True)
    job_file.write_text(DEMO_JOB)
    start = time.monotonic()
    with LocalSwarm(run_dir, job_file, swarm_id="demo", peer_args=("--probe-seconds", "0.3")) as swarm:
        err_console.print(f"starting a coordinator and {peers} peers on loopback (logs in {run_dir})")
        try:
            swarm.start_coordinator()
            for i in range(peers):
                swarm.start_peer(f"peer{i}")
            seen = swarm.wait_for(lambda ps: len(ps) >= peers, timeout_s=timeout)
        except (TimeoutError, RuntimeError) as e:
            tails = "\n".join(f"--- {p.name}\n{p.tail(8)}" for p in swarm.procs.values())
            raise fail(f"{e}\n{tails}") from None
        ready_s = time.monotonic() - start
        Console().print(peers_table(seen, get_dht_time(), f"swarm demo: {len(seen)} live peers"))
        err_console.print(f"all {peers} peers visible after {ready_s:.1f} s; shutting down")
    shutdown_s = time.monotonic() - start - ready_s
    err_console.print(f"shut down cleanly in {shutdown_s:.1f} s")
    if as_json:
        summary = {"peers": len(seen), "ready_s": round(ready_s, 2), "shutdown_s": round(shutdown_s, 2)}
        typer.echo(json.dumps(summary))


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
