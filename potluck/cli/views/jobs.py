"""What ``potluck status`` shows of a swarm of several jobs: each job, its lease and its shares."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from potluck.protocol.allocation import Allocation, JobOffer
from potluck.protocol.training import Progress, TrainPlan


def job_row(
    name: str,
    plan: TrainPlan | None,
    progress: list[Progress],
    allocation: Allocation | None,
    offer: JobOffer | None = None,
) -> dict[str, Any]:
    """One job as JSON-able data: its state, step, weight, leased peers, allocation and received share
    (time fractions summed over peer classes; the allocation's are None on a one-job swarm)."""
    state: str = "waiting" if plan is None else plan.status
    if plan is not None and plan.status == "training" and plan.stop_at is not None:
        state = f"paused after step {plan.stop_at}"  # its lease left it too few peers (docs/multijob.md)
    if offer is not None and offer.done:
        state = "done"
    return {
        "job": name,
        "own": offer is None,  # the swarm's own job (its coordinator's)
        "owner": offer.peer_id if offer is not None else None,
        "weight": offer.weight if offer is not None else None,
        "state": state,
        "epoch": plan.epoch if plan is not None else None,
        "step": max((r.step for r in progress), default=0),
        "peers": allocation.peers_of(name) if allocation is not None else None,
        "allocation": sum(allocation.allocation_of(name).values()) if allocation is not None else None,
        "received": sum(allocation.received_share(name).values()) if allocation is not None else None,
    }


def jobs_table(rows: list[dict[str, Any]], allocation: Allocation | None) -> Table:
    title = "jobs"
    if allocation is not None:
        title += (
            f": allocation round {allocation.round} ({allocation.policy}), "
            f"leases end at {allocation.lease_end:.0f}"
        )
    table = Table(title=title)
    for column in ("job", "state", "step", "weight", "leased peers", "allocation", "received"):
        table.add_column(column)

    def frac(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    for r in rows:
        peers = "all" if r["peers"] is None else ", ".join(p[:12] for p in r["peers"]) or "none"
        name = r["job"] + (" (swarm's own)" if r["own"] else "")
        weight = "-" if r["weight"] is None else f"{r['weight']:g}"
        table.add_row(
            name, r["state"], str(r["step"]), weight, peers, frac(r["allocation"]), frac(r["received"])
        )
    return table
