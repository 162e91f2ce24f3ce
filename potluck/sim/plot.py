"""PNG plots of simulated runs. matplotlib is the optional ``sim`` extra (``pip install
'potluck[sim]'``): the simulator itself needs only numpy, and a run without it still writes CSV.

Two figures: ``throughput_png`` puts runs side by side over simulated time (tokens/s of each run, its
static optimum dashed, and below the fraction of the optimum kept so far); ``dht_png`` shows Kademlia's
load per peer against swarm size on a log axis, where O(log N) is a straight line."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from potluck.sim.errors import SimError
from potluck.sim.runconfig import RunResult

logger = logging.getLogger(__name__)

DPI = 110  # 9 x 6 in at 110 dpi: a 990 x 660 PNG, readable in a README


def _figure(width_in: float, height_in: float) -> Any:
    """A matplotlib Figure with the Agg canvas (no display, no pyplot global state)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise SimError("PNG plots need matplotlib: pip install 'potluck[sim]' (CSV needs nothing)") from e
    fig = Figure(figsize=(width_in, height_in), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def kept_over_time(res: RunResult) -> tuple[np.ndarray, np.ndarray]:
    """(hours, fraction of the static optimum's tokens trained so far) at each sample, from the run's
    exact totals (its last value is the run's ``fraction`` up to the tail after the last sample)."""
    if not res.totals:
        return np.zeros(0), np.zeros(0)
    t, done, best = (np.asarray(c, dtype=np.float64) for c in zip(*res.totals, strict=True))
    return t, np.divide(done, best, out=np.zeros_like(done), where=best > 0)


def throughput_png(runs: Mapping[str, RunResult], path: Path, title: str = "") -> Path:
    """Tokens/s over simulated hours for each named run (its static optimum dashed, same colour), and
    the fraction of the optimum kept so far below; written to ``path``."""
    if not runs:
        raise SimError("no runs to plot")
    fig = _figure(9.0, 6.0)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for i, (name, res) in enumerate(runs.items()):
        if not res.samples:
            continue
        colour = f"C{i % 10}"
        t, rate, opt = zip(*res.samples, strict=True)
        top.plot(t, np.asarray(rate) / 1e3, color=colour, lw=1.0, label=f"{name} ({res.fraction:.1%} kept)")
        top.plot(t, np.asarray(opt) / 1e3, color=colour, lw=0.8, ls="--", alpha=0.6)
        hours, kept = kept_over_time(res)
        bottom.plot(hours, kept, color=colour, lw=1.0)
    top.set_ylabel("k tokens/s (dashed: static optimum)")
    peak = max((max(r, o) for res in runs.values() for _, r, o in res.samples), default=0.0) / 1e3
    top.set_ylim(0.0, 1.1 * peak if peak > 0 else 1.0)  # from zero: a stall is a fall to the axis
    top.set_title("rates are snapshots at each sample; the totals below count the stalls between", fontsize=8)
    top.legend(loc="lower right", fontsize=8)
    top.grid(alpha=0.3)
    bottom.set_ylabel("kept so far")
    bottom.set_xlabel("simulated hours")
    bottom.axhline(0.9, color="grey", lw=0.8, ls=":")  # the repair target
    bottom.set_ylim(0.0, 1.05)
    bottom.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def dht_png(rows: Sequence[Mapping[str, float]], path: Path) -> Path:
    """Messages per peer per minute against N, each point labelled with its requests per lookup
    (``dht.measure`` rows)."""
    if not rows:
        raise SimError("no DHT measurements to plot")
    n = [r["peers"] for r in rows]
    msgs = [r["messages_per_peer_per_min"] for r in rows]
    fig = _figure(7.0, 4.0)
    ax = fig.subplots()
    ax.plot(n, msgs, "o-", color="C0")
    for x, y, r in zip(n, msgs, rows, strict=True):  # label each point with its lookup length
        ax.annotate(
            f"{r['requests_per_lookup']:.1f} req/lookup",
            (x, y),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.set_ylim(0.0, 1.2 * max(msgs))  # from zero: growth is judged against the whole load
    ax.set_xlabel("peers (log scale: O(log N) is a straight line)")
    ax.set_ylabel("DHT messages per peer per minute")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    logger.info("wrote %s", path)
    return path
