"""Benchmarks for collectives. Part 1 (here): spanning-tree packing quality and planning time.

    .venv/bin/python scripts/bench_collectives.py [--quick] [--out bench-out/bench_collectives.json]

Sections:
  dgx     every strongly-connected 3-8 GPU subset of DGX-1V and DGX-1P (181 each): tree all-reduce rate
          vs the exact partition bound, tree count, and the model speedup over NCCL-style rings (NVLink
          rings when a Hamiltonian NVLink cycle exists, else one PCIe ring at 10 GB/s per GPU).
  random  lognormal graphs of 16/32/64 peers: rate / certified upper bound, tree count, planning time.
          Families: "pair" (independent lognormal rate per direction, all pairs linked), "sparse" (30% of
          pairs linked), "home" (per-peer lognormal access rate, sigma 0.5, caps every peer; pair rate =
          min of the two ends x a lognormal path factor <= 1; 3 in 4 peers behind NAT, two of them
          linked only if hole punching works, 30% of pairs), with the one-hop (butterfly) packing and
          hivemind 1.1.12's own butterfly LP (optimize_parts_lp, NATed peers as clients) scored on the
          same links and caps.
  executor (scripts/bench_executor.py: measured vs model, tree vs ring on shaped loopback links)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from hivemind.averaging.load_balancing import optimize_parts_lp

from potluck.coordinator.trees import PackingError, exact_strength, pack_allreduce, pack_rings
from potluck.coordinator.trees.graph import make_network
from potluck.coordinator.trees.plan import effective_rate, tree_plan
from potluck.testbed.topologies import (
    PCIE_GBPS,
    connected_subsets,
    dgx1p,
    dgx1v,
    home_uplinks,
    lognormal_graph,
)


def bench_dgx(quick: bool) -> list[dict[str, Any]]:
    rows = []
    for name, full in (("DGX-1V", dgx1v()), ("DGX-1P", dgx1p())):
        subsets = connected_subsets(full)
        if quick:
            subsets = subsets[::10]
        effs, counts, times, speedups, no_ring = [], [], [], [], 0
        for subset in subsets:
            cap = full[np.ix_(subset, subset)]
            t0 = time.perf_counter()
            p = pack_allreduce(cap)
            times.append(time.perf_counter() - t0)
            strength, _ = exact_strength(make_network(cap))
            effs.append(p.rate / strength)
            counts.append(len(p.trees))
            rings = pack_rings(cap)
            if rings.rings:
                ring_rate = rings.allreduce_rate
            else:
                no_ring += 1
                n = len(subset)
                ring_rate = PCIE_GBPS * n / (2 * (n - 1))  # one ring through the shared PCIe
            speedups.append(p.rate / ring_rate)
        rows.append(
            {
                "machine": name,
                "subsets": len(subsets),
                "no_nvlink_ring": no_ring,
                "eff_min": min(effs),
                "eff_mean": statistics.fmean(effs),
                "trees_max": max(counts),
                "trees_mean": statistics.fmean(counts),
                "plan_s_max": max(times),
                "plan_s_mean": statistics.fmean(times),
                "speedup_min": min(speedups),
                "speedup_geomean": math.exp(statistics.fmean(map(math.log, speedups))),
                "speedup_max": max(speedups),
                "speedup_geomean_no_ring": math.exp(
                    statistics.fmean(
                        [
                            math.log(s)
                            for s, sub in zip(speedups, subsets, strict=True)
                            if not pack_rings(full[np.ix_(sub, sub)]).rings
                        ]
                        or [0.0]
                    )
                ),
            }
        )
    return rows


def _graph(family: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    if family == "pair":
        return lognormal_graph(n, seed), None
    if family == "sparse":
        return lognormal_graph(n, seed, density=0.3), None
    bw = home_uplinks(n, seed, sigma=0.5)
    rng = np.random.default_rng(seed + 1000)
    path = np.minimum(rng.lognormal(0.0, 0.5, size=(n, n)), 1.0)  # a path never beats an access link
    cap = np.minimum.outer(bw, bw) * path
    natted = rng.random(n) < 0.75  # 3 in 4 peers behind NAT (no relays modelled)
    natted[0] = False  # keep one public peer so the group is connected
    punched = np.triu(rng.random((n, n)) < 0.3, 1)  # hole punching works for 30% of NAT-NAT pairs
    punched = punched | punched.T
    cap[np.outer(natted, natted) & ~punched] = 0.0
    np.fill_diagonal(cap, 0.0)
    return cap, bw


def _hivemind_rate(cap: np.ndarray, bw: np.ndarray) -> float:
    """hivemind's butterfly shares (optimize_parts_lp; peers that cannot reach everyone are clients with
    bandwidth 0, as in hivemind's client mode) scored on the same links and caps as the trees."""
    reach_all = (np.minimum(cap, cap.T) > 0).sum(axis=1) == len(bw) - 1
    shares = optimize_parts_lp(1_000_000, np.where(reach_all, bw, 0.0))
    stars = [
        (float(s), [(int(c), v) for v in range(len(bw)) if v != c]) for c, s in enumerate(shares) if s > 0
    ]
    return effective_rate(tree_plan(list(range(len(bw))), stars), cap, bw)


def bench_random(quick: bool) -> list[dict[str, Any]]:
    rows = []
    seeds = range(1) if quick else range(3)
    for family in ("pair", "sparse", "home"):
        for n in (16, 32, 64):
            for seed in seeds:
                cap, node = _graph(family, n, seed)
                t0 = time.perf_counter()
                p = pack_allreduce(cap, node_capacity=node)
                plan_s = time.perf_counter() - t0
                row: dict[str, Any] = {
                    "family": family,
                    "n": n,
                    "seed": seed,
                    "rate": p.rate,
                    "upper_bound": p.upper_bound,
                    "eff": p.efficiency,
                    "trees": len(p.trees),
                    "plan_s": plan_s,
                    "lp_rate": p.stats.lp_rate,
                    "mwu_rate": p.stats.mwu_rate,
                    "bound_kind": min(
                        ("partition", p.certificate.partition_bound),
                        ("dual", p.certificate.dual_bound),
                        ("broadcast", p.certificate.broadcast_bound),
                        ("node", p.certificate.node_bound),
                        key=lambda kv: kv[1],
                    )[0],
                }
                try:
                    row["one_hop_rate"] = pack_allreduce(cap, node_capacity=node, one_hop=True).rate
                except PackingError:  # no peer links to every other: no butterfly without relays
                    row["one_hop_rate"] = None
                if node is not None:
                    row["hivemind_rate"] = _hivemind_rate(cap, node)
                rows.append(row)
                print(
                    f"  {family:6s} N={n:2d} seed={seed} eff={p.efficiency:.4f} trees={len(p.trees):3d} "
                    f"plan={plan_s:5.2f}s",
                    flush=True,
                )
    return rows


def _ratios(values: list[float]) -> str:
    if not values:
        return "n/a"
    geo = math.exp(statistics.fmean(map(math.log, values)))
    return f"{min(values):.2f}/{geo:.2f}/{max(values):.2f}"


def bench_executor(quick: bool) -> list[dict[str, Any]]:
    """Measured executor time vs predict_allreduce_time, tree vs ring (scripts/bench_executor.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_executor import run

    return run(quick)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-out/bench_collectives.json")
    ap.add_argument("--quick", action="store_true", help="every 10th DGX subset, one seed per size")
    ap.add_argument("--sections", default="dgx,random,executor")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    result: dict[str, Any] = {"quick": args.quick}
    if "dgx" in sections:
        result["dgx"] = bench_dgx(args.quick)
        print("\nDGX-1 subsets: tree all-reduce vs exact partition bound; model speedup over rings")
        print(
            f"{'machine':8s} {'subsets':>7s} {'no ring':>7s} {'eff min':>8s} {'trees max':>9s} "
            f"{'trees avg':>9s} {'plan max s':>10s} {'speedup min/geo/max':>20s} {'geo (no ring)':>13s}"
        )
        for r in result["dgx"]:
            print(
                f"{r['machine']:8s} {r['subsets']:7d} {r['no_nvlink_ring']:7d} {r['eff_min']:8.4f} "
                f"{r['trees_max']:9d} {r['trees_mean']:9.2f} {r['plan_s_max']:10.3f} "
                f"{r['speedup_min']:6.2f}/{r['speedup_geomean']:5.2f}/{r['speedup_max']:5.2f} "
                f"{r['speedup_geomean_no_ring']:13.2f}"
            )
    if "random" in sections:
        print("\nrandom lognormal graphs")
        result["random"] = bench_random(args.quick)
        print(
            f"\n{'family':6s} {'N':>3s} {'eff min':>8s} {'trees max':>9s} {'2N':>4s} {'plan max s':>10s} "
            f"{'tree/1-hop':>14s} {'tree/hivemind':>14s}   (ratios: min/geomean/max)"
        )
        for family in ("pair", "sparse", "home"):
            for n in (16, 32, 64):
                rs = [r for r in result["random"] if r["family"] == family and r["n"] == n]
                one = _ratios([r["rate"] / r["one_hop_rate"] for r in rs if r["one_hop_rate"]])
                hm = _ratios([r["rate"] / r["hivemind_rate"] for r in rs if "hivemind_rate" in r])
                print(
                    f"{family:6s} {n:3d} {min(r['eff'] for r in rs):8.4f} {max(r['trees'] for r in rs):9d} "
                    f"{2 * n:4d} {max(r['plan_s'] for r in rs):10.2f} {one:>14s} {hm:>14s}"
                )
    if "executor" in sections:
        result["executor"] = bench_executor(args.quick)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
