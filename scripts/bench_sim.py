#!/usr/bin/env python
"""Swarm simulator at internet scale (issue 21): the real planner in the loop, under heavy-tailed churn.

Steps (each on the reference setup of ``potluck/sim/reference.py``, churn ``potluck/sim/churn.py``):
1. DHT traffic per peer from Kademlia lookups measured at each of ``--dht`` sizes.
2. Headline: ``--peers`` volunteers for ``--hours`` simulated hours, policy "repair" with potluck's start
   barrier (no peer trains until every moved peer holds its state): wall time, throughput kept against
   the static optimum for the live peers, and the coordinator's time per event decision.
3. The same trace with liveput (churn-aware pool tiers), and churn-blind with the same candidate pools
   (chosen by rate): ``liveput_gain`` = liveput's tokens / the latter's - 1 (the objective alone).
4. The same trace, repair with background hand-off (pipelines train on while newcomers fetch).
5. Policies compared (naive, repair, periodic at ``--compare-peers`` for ``--compare-hours``; scratch,
   whose every re-plan is a 1 s search, for ``--scratch-hours``).
6. The loopback chaos run P (``scripts/bench_churn.py``) replayed: predicted steps/s against measured.

    .venv/bin/python scripts/bench_sim.py [--peers 10000] [--hours 24] [--json] [--csv-dir DIR]
        [--plot-dir DIR]

--plot-dir writes PNGs (matplotlib, ``pip install 'potluck[sim]'``): ``day.png`` (the headline trace
under each variant), ``policies.png`` (step 5) and ``dht.png`` (step 1).

With --json the last line is one JSON object (``peers``, ``sim_hours``, ``wall_s``,
``fraction_of_static_optimum``, ``decision_s_max``, ``liveput_gain``, and the rest).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from potluck.sim.dht import measure
from potluck.sim.plot import dht_png, throughput_png
from potluck.sim.reference import reference
from potluck.sim.replay import load_run, replay
from potluck.sim.report import summarize, write_csv
from potluck.sim.run import RunConfig, simulate
from potluck.sim.runconfig import RunResult

RUNS: dict[str, RunResult] = {}  # every run by name, for the plots


def one(peers: int, hours: float, seed: int, csv_dir: str, name: str, **kw: Any) -> dict[str, Any]:
    setup = reference(peers, hours, seed)
    cfg = RunConfig(hours=hours, **kw)
    t0 = time.perf_counter()
    res = simulate(
        setup.pop, setup.trace, setup.job, cfg, setup.planner, np.random.default_rng(seed), setup.fresh
    )
    out = {"peers": peers, **summarize(res, time.perf_counter() - t0)}
    RUNS[name] = res
    if csv_dir:
        out["csv"] = str(write_csv(res, Path(csv_dir) / f"{name}.csv"))
    print(
        f"[{name}] {peers} peers, {hours} h: kept {out['fraction_of_static_optimum']:.3f} of the optimum, "
        f"{out['replans_per_hour']} re-plans/h, decision max {out['decision_s']['max']} s, "
        f"moved/event {out['moved_per_event']['mean']}, {out['state_gb_moved']} GB moved, "
        f"wall {out['wall_s']} s",
        flush=True,
    )
    return out


def plots(out: Path, dht: list[dict[str, float]], headline: str) -> list[str]:
    day = {
        n: RUNS[n]
        for n in ("repair", "repair-background", "repair-liveput", "repair-equal-search")
        if n in RUNS
    }
    written = [throughput_png(day, out / "day.png", f"{headline}: repair and its variants")]
    compare = {n.removeprefix("compare-"): r for n, r in RUNS.items() if n.startswith("compare-")}
    if compare:
        written.append(throughput_png(compare, out / "policies.png", "policies compared"))
    if dht:
        written.append(dht_png(dht, out / "dht.png"))
    for path in written:
        print(f"[plot] {path}", flush=True)
    return [str(p) for p in written]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peers", type=int, default=10000)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dht", type=int, nargs="*", default=[1000, 3000, 10000])
    ap.add_argument("--compare-peers", type=int, default=1000)
    ap.add_argument("--compare-hours", type=float, default=8.0)
    ap.add_argument("--scratch-hours", type=float, default=2.0, help="scratch re-plans take ~1 s each")
    ap.add_argument("--skip", nargs="*", default=[], choices=["liveput", "background", "compare", "replay"])
    ap.add_argument("--liveput-seeds", type=int, nargs="*", default=[])
    ap.add_argument("--liveput-peers", type=int, default=2000)
    ap.add_argument("--liveput-hours", type=float, default=12.0)
    ap.add_argument("--csv-dir", default="")
    ap.add_argument("--plot-dir", default="", help="write day.png, policies.png and dht.png here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t_all = time.perf_counter()
    dht = [measure(n, np.random.default_rng(0)) for n in args.dht]
    for m in dht:
        print(
            f"[dht] {int(m['peers'])} peers: {m['requests_per_lookup']:.1f} requests/lookup in "
            f"{m['rounds_per_lookup']:.1f} rounds, {m['messages_per_peer_per_min']:.0f} messages/peer/min",
            flush=True,
        )
    slope = 0.0
    if len(dht) >= 2:
        x = np.log2([m["peers"] for m in dht])
        slope = float(np.polyfit(x, [m["requests_per_lookup"] for m in dht], 1)[0])
    head = one(args.peers, args.hours, args.seed, args.csv_dir, "repair", policy="repair")
    summary: dict[str, Any] = {
        "peers": args.peers,
        "sim_hours": args.hours,
        "wall_s": head["wall_s"],
        "fraction_of_static_optimum": head["fraction_of_static_optimum"],
        "decision_s_max": head["decision_s"]["max"],
        "liveput_gain": None,
        "dht": dht,
        "dht_requests_per_doubling": round(slope, 3),
        "repair": head,
    }
    if "liveput" not in args.skip:
        aware = one(
            args.peers,
            args.hours,
            args.seed,
            args.csv_dir,
            "repair-liveput",
            policy="repair",
            churn_aware=True,
        )
        same = one(
            args.peers,
            args.hours,
            args.seed,
            args.csv_dir,
            "repair-equal-search",
            policy="repair",
            equal_search=True,
        )
        # Against the churn-blind planner given the same candidate pools: liveput's objective alone.
        summary["liveput_gain"] = round(aware["tokens"] / same["tokens"] - 1.0, 4)
        summary["liveput_gain_vs_plain_repair"] = round(aware["tokens"] / head["tokens"] - 1.0, 4)
        summary["repair_liveput"] = aware
        summary["repair_equal_search"] = same
    if args.liveput_seeds:
        # The planner's searches stop on wall-clock limits, so one run's plans are one draw: repeat the
        # comparison on smaller swarms over several seeds.
        gains = []
        for seed in args.liveput_seeds:
            kw = {"policy": "repair"}
            a = one(
                args.liveput_peers, args.liveput_hours, seed, "", f"liveput-s{seed}", churn_aware=True, **kw
            )
            b = one(
                args.liveput_peers,
                args.liveput_hours,
                seed,
                "",
                f"equal-search-s{seed}",
                equal_search=True,
                **kw,
            )
            gains.append(round(a["tokens"] / b["tokens"] - 1.0, 4))
        summary["liveput_gain_seeds"] = {
            "peers": args.liveput_peers,
            "hours": args.liveput_hours,
            "seeds": args.liveput_seeds,
            "gains": gains,
            "mean": round(float(np.mean(gains)), 4),
        }
        print(
            f"[liveput] gains over seeds {args.liveput_seeds}: {gains} (mean {np.mean(gains):+.3f})",
            flush=True,
        )
    if "background" not in args.skip:
        summary["repair_background"] = one(
            args.peers,
            args.hours,
            args.seed,
            args.csv_dir,
            "repair-background",
            policy="repair",
            background_handoff=True,
        )
    if "compare" not in args.skip:
        summary["compare"] = {}
        for pol in ("naive", "repair", "periodic", "scratch"):
            hours = args.scratch_hours if pol == "scratch" else args.compare_hours
            summary["compare"][pol] = one(
                args.compare_peers, hours, args.seed, args.csv_dir, f"compare-{pol}", policy=pol
            )
    if "replay" not in args.skip:
        summary["replay"] = replay(load_run())
        r = summary["replay"]
        print(
            f"[replay] loopback run P: predicted {r['predicted_steps_per_s']} steps/s, measured "
            f"{r['measured_steps_per_s']} ({r['error']:+.1%}); stalls {r['predicted_stall_total_s']} s "
            f"predicted, {r['measured_recovery_total_s']} s measured",
            flush=True,
        )
    if args.plot_dir:
        summary["plots"] = plots(Path(args.plot_dir), dht, f"{args.peers} peers, {args.hours:g} h")
    summary["bench_wall_s"] = round(time.perf_counter() - t_all, 1)
    print(
        f"headline: {args.peers} peers x {args.hours} h in {summary['wall_s']} s (target <= 600 s); kept "
        f"{summary['fraction_of_static_optimum']:.3f} (target >= 0.90); decision max "
        f"{summary['decision_s_max']} s (target <= 1 s); liveput gain {summary['liveput_gain']} "
        "(target >= 0.20)",
        flush=True,
    )
    if args.json:
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
