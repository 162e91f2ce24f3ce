"""``potluck serve``: query a class-parallel job's sub-networks over the swarm (docs/class-parallel.md).

Reads one query per line from stdin and prints one JSON line per query to stdout:

- a query is a JSON object ``{"id": ..., "x": [...]}`` whose ``x`` is one 16 x 16 image (nested lists),
  (1, 16, 16), or a batch (N, 1, 16, 16), at most 64 images; or a path to a ``.npy`` file of the same;
- the answer is ``{"id", "scores": N lists of K floats (float32 values, class order), "argmax",
  "workers": the coded workers decoded from, in arrival order, "holders": their peers, "latency_ms"}``,
  or ``{"id", "error"}`` when a query cannot be answered (the next line is read on). With ``--check``
  every reply is waited for and the answer adds ``"consistent"`` (two decodings agreed; null: too few
  replies to tell) and ``"suspect"`` (the worker whose reply disagreed, left out of the answer).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import typer

from potluck.cli.common import fail, network_config, parse_invite
from potluck.errors import PotluckError
from potluck.protocol.errors import ProtocolError

if TYPE_CHECKING:
    from potluck.classpar.swarm.client import ServeClient

MAX_LINE_BYTES = 1 << 20
SIDE = 16


def parse_query(line: str, number: int) -> tuple[Any, np.ndarray]:
    """(id, images (N, 1, 16, 16) float32) of one stdin line; ``ValueError`` says what is wrong."""
    text = line.strip()
    if len(text) > MAX_LINE_BYTES:
        raise ValueError(f"a query line is limited to {MAX_LINE_BYTES} bytes")
    if text.startswith("{"):
        doc = json.loads(text)
        if not isinstance(doc, dict) or "x" not in doc:
            raise ValueError('a JSON query is an object with "x"')
        qid, raw = doc.get("id", number), np.asarray(doc["x"], dtype=np.float32)
    else:
        qid, raw = text, np.load(Path(text), allow_pickle=False).astype(np.float32)
    if raw.shape[-2:] != (SIDE, SIDE):
        raise ValueError(f"images must be {SIDE} x {SIDE}, got shape {raw.shape}")
    x = raw.reshape(-1, 1, SIDE, SIDE)
    if raw.ndim > 4 or not 1 <= len(x) <= 64 or not np.isfinite(x).all():
        raise ValueError(f"1 to 64 finite images per query, got shape {raw.shape}")
    return qid, x


async def _serve_lines(client: ServeClient, check: bool = False) -> int:
    """Answer stdin line by line; returns the number of queries that failed."""
    failed, number = 0, 0
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return failed
        if not line.strip():
            continue
        number += 1
        qid: Any = number
        try:
            qid, x = parse_query(line, number)
            ans = await client.query(x, check)
        except (ValueError, OSError, PotluckError) as e:
            failed += 1
            typer.echo(json.dumps({"id": qid, "error": str(e)}))
            continue
        doc = {
            "id": qid,
            "scores": [[float(v) for v in row] for row in ans.scores],
            "argmax": [int(i) for i in ans.scores.argmax(axis=1)],
            "workers": ans.workers,
            "holders": [client.plan.workers[w] for w in ans.workers],
            "latency_ms": round(ans.latency_s * 1e3, 3),
        }
        if check:
            doc |= {"consistent": ans.consistent, "suspect": ans.suspect}
        typer.echo(json.dumps(doc))


async def _run(join: str, job: str, timeout: float, wait: float, check: bool) -> int:
    from potluck.classpar.swarm.client import ServeClient  # hivemind and torch: only once the command runs

    invite = parse_invite(join)
    net = network_config(None, None, "/ip4/127.0.0.1/tcp/0", bootstrap_timeout_s=timeout)
    client = await ServeClient.connect(invite, net, job, timeout, wait)
    try:
        plan = client.plan
        typer.echo(
            f"serving job {job}: {len(plan.groups)} groups, {plan.parity} parities, "
            f"{len(plan.holders)} holders (plan epoch {plan.epoch})",
            err=True,
        )
        for w, peer in enumerate(plan.workers):
            role = f"group {plan.groups[w]}" if w < len(plan.groups) else "parity"
            typer.echo(f"  worker {w}: {peer} ({role})", err=True)
        return await _serve_lines(client, check)
    finally:
        await client.close()


def serve(
    join: str = typer.Option(..., "--join", help="The swarm's invite (or @FILE)."),
    job: str = typer.Option(..., "--job", help="The class-parallel job to query."),
    timeout: float = typer.Option(10.0, min=0.1, help="Seconds allowed for joining, and for each query."),
    wait: float = typer.Option(0.0, min=0.0, help="Seconds to wait for the job to be serving."),
    check: bool = typer.Option(
        False,
        "--check",
        help="Wait for every holder's reply and cross-check two decodings (finds one lying holder).",
    ),
) -> None:
    """Answer class-parallel queries from stdin (JSON lines or .npy paths), one JSON line each."""
    try:
        failed = asyncio.run(_run(join, job, timeout, wait, check))
    except (ProtocolError, TimeoutError) as e:
        raise fail(f"cannot serve job {job}: {e or 'timed out'}") from None
    if failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
