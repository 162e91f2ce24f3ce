"""Summaries of simulated runs: one JSON-ready dict per run, and CSV time series (one row per sample:
hour, tokens/s, static optimum's tokens/s) that any tool reads; PNG plots are ``plot.py``'s.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

import numpy as np

from potluck.sim.run import RunResult

logger = logging.getLogger(__name__)


def _stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0, "max": 0.0, "median": 0.0, "p99": 0.0, "mean": 0.0}
    a = np.asarray(xs, dtype=np.float64)
    return {
        "n": len(xs),
        "max": round(float(a.max()), 4),
        "median": round(float(np.median(a)), 4),
        "p99": round(float(np.quantile(a, 0.99)), 4),
        "mean": round(float(a.mean()), 4),
    }


def summarize(res: RunResult, wall_s: float | None = None) -> dict[str, Any]:
    """Figures of one run. Event decisions are the repairs and scratch re-plans that answer churn; the
    first plan, periodic re-plans and the static optimum's searches are reported apart."""
    events = [d for d in res.decisions[1:] if not d.get("periodic")]
    periodic = [d for d in res.decisions if d.get("periodic")]
    hours = max(res.hours, 1e-9)
    out: dict[str, Any] = {
        "policy": res.policy,
        "churn_aware": res.churn_aware,
        "sim_hours": res.hours,
        "fraction_of_static_optimum": round(res.fraction, 4),
        "tokens": res.tokens,
        "optimum_tokens": res.optimum_tokens,
        "replans_per_hour": round((len(res.decisions) - 1) / hours, 2),
        "decisions": len(res.decisions) - 1,
        "periodic_adopted": len(periodic),
        "placed_departures": res.placed_departures,
        "joins": res.joins,
        "leaves": res.leaves,
        "moved_per_event": _stats([d["moved"] for d in events]),
        "state_gb_moved": round(sum(d["state_bytes"] for d in res.decisions[1:]) / 1e9, 2),
        "handoff_s": _stats([d["handoff_s"] for d in events]),
        "decision_s": _stats([d["decision_s"] for d in events]),
        "first_plan_s": round(res.decisions[0]["decision_s"], 3) if res.decisions else None,
        "optimum_search_s": _stats(res.optimum_s),
    }
    if wall_s is not None:
        out["wall_s"] = round(wall_s, 1)
    return out


def write_csv(res: RunResult, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["hour", "tokens_per_s", "optimum_tokens_per_s", "tokens", "optimum_tokens"])
        for (t, rate, opt), (_, done, best) in zip(res.samples, res.totals, strict=True):
            w.writerow([f"{t:.4f}", f"{rate:.1f}", f"{opt:.1f}", f"{done:.0f}", f"{best:.0f}"])
    logger.info("wrote %s", path)
    return path
