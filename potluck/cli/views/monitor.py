"""What ``potluck monitor`` draws: one rich frame from a dashboard snapshot (``SwarmView.snapshot`` or the
dashboard's ``/api/v1/state``). Pure: data in, renderable out."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

COLORS = {
    "contributing": "green",
    "syncing": "blue",
    "joining": "magenta",
    "spare": "white",
    "stale": "yellow",
    "unreachable": "dark_orange",
    "leaving": "grey50",
    "offline": "red",
}
PARTS = ("compute", "send", "recv", "allreduce", "idle")
PART_MARKS = {"compute": "█", "send": "▓", "recv": "▒", "allreduce": "░", "idle": "·"}


def _state(state: str) -> Text:
    return Text(f"● {state}", style=COLORS.get(state, "white"))


def _short(peer: str) -> str:
    return "…" + peer[-8:]


def _split(timing: dict[str, float] | None, width: int = 20) -> str:
    """The step's seconds by part as a bar: █ compute ▓ send ▒ recv ░ all-reduce · idle."""
    if not timing or not timing.get("total"):
        return ""
    total = timing["total"]
    return "".join(PART_MARKS[p] * round(width * timing.get(p, 0.0) / total) for p in PARTS)[:width]


def _bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def frame(snap: dict[str, Any], source: str) -> Group:
    job = snap.get("job")
    head = Text(f"swarm {snap['swarm']}  ", style="bold")
    if job:
        loss = "–" if job["loss"] is None else f"{job['loss']:.4f}"
        eta = job.get("eta_s")
        why = f" ({job['reason']})" if job["state"] == "waiting" and job.get("reason") else ""
        head.append(
            f"job {job['name']}: {job['state']}{why}, step {job['step']}/{job['steps']}, loss {loss}, "
            f"{job['tokens_per_s']:,.0f} tok/s{'' if eta is None else f', ETA {eta / 60:,.0f} min'}, "
            f"plan epoch {job['epoch']}"
        )
    else:
        head.append("no word from the coordinator yet", style="italic")
    counts = Text("  ".join(f"{n} {s}" for s, n in sorted(snap["counts"].items())) or "no peers yet")
    parts: list[Any] = [head, counts]
    plan = snap.get("plan")
    if plan and plan["stages"]:
        grid = Table(
            title=f"plan epoch {plan['epoch']} (from step {plan['start_step']})", title_justify="left"
        )
        grid.add_column("stage")
        grid.add_column("layers")
        for r in range(max(len(st["replicas"]) for st in plan["stages"])):
            grid.add_column(f"replica {r}")
        for st in plan["stages"]:
            cells = [Text.assemble(_short(rep["peer"]), " ", _state(rep["state"])) for rep in st["replicas"]]
            grid.add_row(str(st["stage"]), st["layers"], *cells)
        for sp in plan["spares"]:
            grid.add_row("spare", "", Text(f"{_short(sp['peer'])}: {sp['reason']}"))
        parts.append(grid)
    peers = Table(title="peers", title_justify="left")
    for col in (
        "peer",
        "state",
        "stage",
        "step",
        "tok/s",
        "step time █▓▒░·",
        "s/step",
        "sent",
        "contributed",
    ):
        peers.add_column(col, no_wrap=True)
    for p in snap["peers"]:
        timing = p.get("timing")
        where = "–" if p["stage"] is None else f"{p['stage']}/{p['replica']}"
        peers.add_row(
            _short(p["id"]),
            _state(p["state"]),
            where,
            str(p["step"]),
            f"{p['tokens_per_s']:,.0f}",
            _split(timing),
            f"{timing['total']:.3f}" if timing else "",
            _bytes(p["bytes_sent"]),
            f"{p['tokens_contributed']:,} tok",
        )
        why = p.get("last_abort") or (p.get("message") if p["state"] != "contributing" else "")
        if why:
            peers.add_row("", Text(f"  {why}"[:160], style="dim"), "", "", "", "", "", "", "")
    parts.append(peers)
    events = snap.get("events", [])[:8]
    if events:
        lines = []
        for e in events:
            at = time.strftime("%H:%M:%S", time.localtime(e["at"]))
            lines.append(f"{at} {e['kind']:<14} {_short(e['peer'])} {e['detail']}"[:200])
        parts.append(Text("recent events\n" + "\n".join(lines), style="dim"))
    t = snap.get("telemetry", {})
    parts.append(
        Text(f"{source}; {t.get('messages', 0)} messages, {t.get('rejected', 0)} refused", style="dim")
    )
    return Group(*parts)
