"""``potluck status``: read the live peers of a swarm as a DHT client."""

from __future__ import annotations

import asyncio
import json
import time

import typer
from rich.console import Console

from potluck.cli.common import fail, network_config, parse_invite, peers_table
from potluck.cli.views.job import plan_table
from potluck.cli.views.jobs import job_row, jobs_table
from potluck.cli.views.model import job_lines
from potluck.protocol.errors import ProtocolError
from potluck.protocol.membership import links_summary


def status(
    join: str = typer.Option(..., "--join", help="The swarm's invite (or @FILE)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    timeout: float = typer.Option(15.0, min=1.0, help="Seconds allowed for joining and reading."),
) -> None:
    """Print the swarm's live peers (device, memory, TFLOP/s, heartbeat age), the plan and progress, and
    on a swarm of several jobs each job with its lease, allocation and received share."""
    from potluck.net.client import read_swarm  # hivemind: only once the command runs

    invite = parse_invite(join)
    net = network_config(None, None, "/ip4/127.0.0.1/tcp/0", bootstrap_timeout_s=timeout)
    try:
        reading = asyncio.run(read_swarm(invite, net, timeout_s=timeout))
    except (ProtocolError, TimeoutError) as e:
        raise fail(f"could not read swarm {invite.swarm_id}: {e or 'timed out'}") from None
    now = time.time()  # hivemind's DHT time is the wall clock (hivemind.utils.get_dht_time is time.time)
    peers, links, plan, progress = reading.peers, reading.links, reading.plan, reading.progress
    alloc = reading.allocation
    jobs = [job_row(plan.job, plan, progress, alloc)] if plan is not None else []
    for offer in reading.offers:
        other_plan, other_progress = reading.others.get(offer.job, (None, []))
        jobs.append(job_row(offer.job, other_plan, other_progress, alloc, offer))
    n_stages = len(plan.stages) if plan is not None and plan.stages else None
    if as_json:
        doc = {
            "swarm_id": invite.swarm_id,
            "peers": [p.summary(now) for p in peers],
            "links": links_summary(links),
            "plan": plan.model_dump(mode="json") if plan is not None else None,
            "progress": [r.model_dump(mode="json") for r in progress],
            "jobs": jobs,
            "allocation": alloc.model_dump(mode="json") if alloc is not None else None,
            "classpar": reading.classpar.model_dump(mode="json") if reading.classpar is not None else None,
            "job": reading.spec.model_dump(mode="json") if reading.spec is not None else None,
            "job_summary": job_lines(reading.spec, n_stages) if reading.spec is not None else [],
        }
        typer.echo(json.dumps(doc, indent=2))
    else:
        console = Console(markup=False)  # peers' addresses and messages are printed as they are
        console.print(peers_table(peers, now, f"swarm {invite.swarm_id}: {len(peers)} live peers"))
        n_links = sum(len(r.links) for r in links.values())
        console.print(f"{n_links} measured links from {len(links)} peers (details: --json)")
        if reading.spec is not None:
            for line in job_lines(reading.spec, n_stages):
                console.print(line, highlight=False)
        if plan is not None:
            paused = f", paused after step {plan.stop_at}" if plan.stop_at is not None else ""
            waits = f", {plan.waiting} (gone: {', '.join(p[:12] for p in plan.gone)})" if plan.waiting else ""
            console.print(plan_table(plan, f"job {plan.job}: {plan.status}{paused}{waits}"))
            for r in progress:
                loss = f"loss {r.loss:.3f}" if r.loss is not None else ""
                where = f"stage {r.stage} replica {r.replica} {r.peer_id[:12]}"
                if r.state == "waiting":  # not placed: its message says why (a spare's reason)
                    where = f"spare {r.peer_id[:12]}"
                line = f"  {where}: {r.state} at step {r.step} {loss} {r.tokens_per_s:,.0f} tok/s {r.message}"
                console.print(line, highlight=False)
        if reading.classpar is not None:
            cp = reading.classpar
            console.print(
                f"class-parallel job {cp.job}: {cp.status} (plan epoch {cp.epoch})", highlight=False
            )
            for w, peer in enumerate(cp.workers):
                role = f"group {cp.groups[w]}" if w < len(cp.groups) else "parity"
                console.print(f"  worker {w}: {peer} ({role})", highlight=False)
        if reading.offers or alloc is not None:
            console.print(jobs_table(jobs, alloc))


def register(app: typer.Typer) -> None:
    app.command("status")(status)
