#!/usr/bin/env python
"""Planner benchmarks: DT-FM's five cases, random heterogeneous swarms at scale, and re-planning.

    .venv/bin/python scripts/bench_planner.py                       # everything
    .venv/bin/python scripts/bench_planner.py --only dtfm           # the five DT-FM cases
    .venv/bin/python scripts/bench_planner.py --only small          # <= 16 peers: gap to the exact optimum
    .venv/bin/python scripts/bench_planner.py --only small-step     # 8 peers, step objective vs brute force
    .venv/bin/python scripts/bench_planner.py --only scale --sizes 64 256 1024
    .venv/bin/python scripts/bench_planner.py --only netmodel       # link estimation error, held-out pairs
    .venv/bin/python scripts/bench_planner.py --only replan
    .venv/bin/python scripts/bench_planner.py --only home          # asymmetric home swarms vs annealing

Prints tables and writes JSON to --out (default bench-out/planner.json).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from potluck.coordinator.placement import PlannerConfig, PlanningState, plan
from potluck.coordinator.placement.bounds import dtfm_lower_bound
from potluck.coordinator.placement.costmodel import (
    BatchSpec,
    CodecRatios,
    DeviceSpec,
    DtfmJob,
    ModelShape,
    StepJob,
    directed_bandwidth,
    dtfm_cost,
)
from potluck.coordinator.placement.exhaustive import step_optimum
from potluck.coordinator.placement.netmodel import (
    AccessCapacity,
    LinkMeasurement,
    from_matrices,
    holdout_error,
)
from potluck.coordinator.placement.objectives import DtfmObjective, StepObjective
from potluck.coordinator.placement.scenario import load_scenario, scenario_from_dict
from potluck.coordinator.placement.search import evaluate
from potluck.coordinator.placement.templates import template_partitions
from potluck.coordinator.placement.tsp import open_path
from potluck.testbed.homes import home_swarm

# Their GA's COMM-COST on these files, measured with their code and default budget (research note §5.3).
DTFM_GA = {1: 3.440, 2: 43.547, 3: 16.087, 4: 34.802, 5: 49.218}


def bench_dtfm(time_limit: float, seed: int) -> list[dict]:
    rows = []
    print(
        f"{'case':>4} {'ours':>8} {'solve s':>8} {'to best':>8} {'their GA':>9} {'strided':>8} "
        f"{'contig':>8} {'best tmpl':>9} {'random':>8} {'bound':>8} {'method':>14}"
    )
    for case in range(1, 6):
        sc = load_scenario(f"dtfm-case{case}")
        job = sc.dtfm_job
        assert job is not None
        start = time.monotonic()
        result, _ = plan(sc.state, job, 0.0, None, PlannerConfig(seed=seed, time_limit_s=time_limit))
        solve = time.monotonic() - start
        assert result is not None
        check = dtfm_cost(np.array(result.stages), sc.state.net, job).total
        assert math.isclose(check, result.cost, rel_tol=1e-9), (check, result.cost)
        obj = DtfmObjective(sc.state.net, job)
        everyone = np.arange(len(sc.state.peers))
        empty = np.array([], dtype=np.int64)
        tmpl = {
            name: evaluate(obj, g, empty).cost
            for name, g in template_partitions(obj.link, everyone, job.n_stages, job.n_replicas)
        }
        # DT-FM's "random" scheduler: 5000 random layouts, identity matching, fixed order; best kept.
        rng = np.random.default_rng(seed)
        shape = (job.n_stages, job.n_replicas)
        n = len(sc.state.peers)
        rand = min(dtfm_cost(rng.permutation(n).reshape(shape), sc.state.net, job).total for _ in range(5000))
        to_best = float(result.detail["seconds_to_best"])
        row = {
            "case": case,
            "ours": result.cost,
            "solve_s": solve,
            "seconds_to_best": to_best,
            "their_ga": DTFM_GA[case],
            "strided": tmpl["strided"],
            "contiguous": tmpl["contiguous"],
            "best_template": min(tmpl.values()),
            "random_best_of_5000": rand,
            "lower_bound": result.lower_bound,
            "bound": result.bound_method,
            "template": result.template,
        }
        rows.append(row)
        print(
            f"{case:>4} {row['ours']:8.3f} {solve:8.2f} {to_best:8.3f} {row['their_ga']:9.3f} "
            f"{row['strided']:8.3f} {row['contiguous']:8.3f} {row['best_template']:9.3f} {rand:8.3f} "
            f"{result.lower_bound:8.3f} {result.bound_method:>14}"
        )
    return rows


GPUS = [  # (effective TFLOP/s, memory GB, share of the swarm)
    (15.0, 16.0, 0.25),  # T4-class
    (35.0, 24.0, 0.35),  # 3090-class
    (80.0, 24.0, 0.25),  # 4090-class
    (150.0, 80.0, 0.15),  # A100-class
]


def random_swarm(n: int, seed: int) -> PlanningState:
    """Clustered geography (regions > sites), lognormal access bandwidth, mixed GPUs."""
    rng = np.random.default_rng(seed)
    regions = rng.uniform(0, 150, (6, 2))  # ms-scale positions of 6 regions
    n_sites = max(2, n // 16)
    site_region = rng.integers(0, 6, n_sites)
    site_pos = regions[site_region] + rng.normal(0, 5, (n_sites, 2))
    site = rng.integers(0, n_sites, n)
    pos = site_pos[site]
    lat = np.linalg.norm(pos[:, None] - pos[None], axis=2) / 2 + rng.uniform(0.5, 3, n)[:, None]
    lat = (lat + lat.T) / 2
    same = site[:, None] == site[None]
    lat = np.where(same, 0.3, lat)
    np.fill_diagonal(lat, 0.0)
    up = rng.lognormal(np.log(0.5), 0.8, n)  # Gbit/s, median 0.5
    down = up * rng.uniform(1, 4, n)
    bw = np.minimum(up[:, None], down[None])
    bw = np.where(same, 10.0, bw)  # a site's LAN
    kinds = rng.choice(len(GPUS), size=n, p=[g[2] for g in GPUS])
    devices = tuple(DeviceSpec(GPUS[k][0] * rng.uniform(0.85, 1.15), GPUS[k][1]) for k in kinds)
    return PlanningState(tuple(range(n)), devices, from_matrices(lat, bw, up, down))


# Compressed wire formats on WAN links (int4-like activations, ~50x gradient compression), raw on LANs.
SCALE_JOB = StepJob(
    ModelShape(layers=32, d_model=2048, heads=16, vocab=50257, seq_len=1024),
    BatchSpec(sequences_per_step=2048, micro_batch=1),
    CodecRatios(activation_wan=0.25, gradient_wan=0.02, lan_gbps=5.0),
)


def _baselines(state: PlanningState, s: int, r: int, seed: int) -> tuple[float, float]:
    """Best structured template and a random layout, both on the plan's shape with the same active set."""
    obj = StepObjective(state.net, state.devices, SCALE_JOB, s, r)
    ranked = sorted(range(len(state.devices)), key=lambda k: (-state.devices[k].tflops, k))
    active, spares = np.sort(ranked[: s * r]), np.sort(ranked[s * r :])
    tmpl = min(evaluate(obj, g, spares).cost for _, g in template_partitions(obj.link, active, s, r)[:2])
    rng = np.random.default_rng(seed)
    everyone = rng.permutation(len(state.devices))
    rand = evaluate(obj, everyone[: s * r].reshape(s, r), np.sort(everyone[s * r :])).cost
    return tmpl, rand


def bench_scale(sizes: list[int], seed: int) -> list[dict]:
    rows = []
    print(
        f"{'peers':>6} {'limit s':>8} {'solve s':>8} {'shape':>8} {'spares':>6} {'step s':>8} "
        f"{'template':>9} {'random':>8} {'bound':>8} {'gap':>7}"
    )
    for n in sizes:
        state = random_swarm(n, seed)
        limit = {64: 5.0, 256: 10.0, 1024: 25.0}.get(n, 240.0)
        start = time.monotonic()
        result, _ = plan(state, SCALE_JOB, 0.0, None, PlannerConfig(seed=seed, time_limit_s=limit))
        solve = time.monotonic() - start
        assert result is not None
        tmpl, rand = _baselines(state, result.n_stages, result.n_replicas, seed)
        row = {
            "peers": n,
            "time_limit_s": limit,
            "solve_s": solve,
            "stages": result.n_stages,
            "replicas": result.n_replicas,
            "spares": len(result.spares),
            "step_s": result.cost,
            "template_s": tmpl,
            "random_s": rand,
            "lower_bound_s": result.lower_bound,
            "gap": result.gap,
        }
        rows.append(row)
        shape = f"{result.n_stages:>3}x{result.n_replicas:<4}"
        print(
            f"{n:>6} {limit:8.0f} {solve:8.2f} {shape} {len(result.spares):>6} {result.cost:8.3f} "
            f"{tmpl:9.3f} {rand:8.3f} {result.lower_bound:8.3f} {100 * result.gap:6.0f}%"
        )
    return rows


def small_instance(n: int, seed: int) -> PlanningState:
    """A few sites with fast LANs and slower, uneven WAN links between them (DT-FM-style matrices)."""
    rng = np.random.default_rng(seed)
    sites = max(2, n // 4)
    site = rng.integers(0, sites, n)
    far_lat = rng.uniform(10, 120, (sites, sites))
    far_bw = rng.uniform(0.3, 1.3, (sites, sites))
    far_lat, far_bw = (far_lat + far_lat.T) / 2, (far_bw + far_bw.T) / 2
    same = site[:, None] == site[None]
    lat = np.where(same, 5.0, far_lat[site][:, site])
    bw = np.where(same, 2.0, far_bw[site][:, site])
    np.fill_diagonal(lat, 0.0)
    devices = tuple(DeviceSpec(50.0, 16.0) for _ in range(n))
    return PlanningState(tuple(range(n)), devices, from_matrices(lat, bw))


def bench_small(seed: int, repeats: int) -> list[dict]:
    """DT-FM objective on <= 16 peers: the plan against the exact optimum (enumeration) as the bound."""
    rows = []
    print(
        f"{'peers':>6} {'shape':>6} {'inst':>5} {'ours':>8} {'bound':>8} {'method':>20} {'gap':>7} "
        f"{'solve s':>8}"
    )
    for n, s, r in [(8, 2, 4), (8, 4, 2), (12, 3, 4), (12, 4, 3), (16, 4, 4), (16, 2, 8)]:
        for k in range(repeats):
            state = small_instance(n, seed + 100 * k + n)
            job = DtfmJob(s, r, 0.65, 0.4712)
            start = time.monotonic()
            cfg = PlannerConfig(seed=seed, time_limit_s=2.0, bound_time_limit_s=0.0)
            result, _ = plan(state, job, 0.0, None, cfg)
            solve = time.monotonic() - start
            assert result is not None
            lower, method = dtfm_lower_bound(DtfmObjective(state.net, job), np.arange(n), time_limit_s=30.0)
            gap = result.cost / lower - 1.0
            rows.append(
                {
                    "peers": n,
                    "stages": s,
                    "replicas": r,
                    "instance": k,
                    "cost": result.cost,
                    "lower_bound": lower,
                    "bound": method,
                    "gap": gap,
                    "solve_s": solve,
                }
            )
            print(
                f"{n:>6} {s:>3}x{r:<2} {k:>5} {result.cost:8.3f} {lower:8.3f} {method:>20} "
                f"{100 * gap:6.2f}% {solve:8.2f}"
            )
    return rows


SMALL_STEP_JOB = StepJob(
    ModelShape(layers=16, d_model=1024, heads=16, vocab=32000, seq_len=1024),
    BatchSpec(sequences_per_step=64, micro_batch=1),
    CodecRatios(activation_wan=0.25, gradient_wan=0.02, lan_gbps=5.0),
)


def bench_small_step(seed: int, repeats: int) -> list[dict]:
    """Step objective on 8 peers: the plan against the brute-force optimum (every shape, subset, order)."""
    rows = []
    print(
        f"{'peers':>6} {'inst':>5} {'ours':>8} {'shape':>6} {'optimum':>8} {'shape':>6} {'gap':>7} "
        f"{'solve s':>8}"
    )
    for k in range(repeats):
        state = random_swarm(8, seed + k)
        optimum, shape = step_optimum(state.net, state.devices, SMALL_STEP_JOB)
        start = time.monotonic()
        result, _ = plan(state, SMALL_STEP_JOB, 0.0, None, PlannerConfig(seed=seed, time_limit_s=3.0))
        solve = time.monotonic() - start
        assert result is not None
        gap = result.cost / optimum - 1.0
        rows.append(
            {
                "peers": 8,
                "instance": k,
                "cost": result.cost,
                "shape": [result.n_stages, result.n_replicas],
                "optimum": optimum,
                "optimum_shape": list(shape),
                "gap": gap,
                "solve_s": solve,
            }
        )
        ours = f"{result.n_stages}x{result.n_replicas}"
        print(
            f"{8:>6} {k:>5} {result.cost:8.3f} {ours:>6} {optimum:8.3f} {shape[0]}x{shape[1]:<4} "
            f"{100 * gap:6.2f}% {solve:8.2f}"
        )
    return rows


def bench_netmodel(sizes: list[int], seed: int) -> list[dict]:
    """Estimation error on held-out pairs when each peer measures only ~log2(N) others."""
    rows = []
    print(
        f"{'peers':>6} {'per peer':>8} {'held out':>8} {'lat med':>8} {'lat p90':>8} {'bw med':>8} "
        f"{'bw p90':>8} {'bw med (caps)':>13} {'fit s':>6}"
    )
    for n in sizes:
        state = random_swarm(n, seed)
        lat, bw = state.net.latency_ms, state.net.bandwidth_gbps
        rng = np.random.default_rng(seed)
        per_peer = max(4, math.ceil(math.log2(n)))
        measurements = []
        for i in range(n):
            for j in rng.choice(n, per_peer + 1, replace=False):
                if i != j:
                    measurements.append(LinkMeasurement(i, int(j), 2.0 * lat[i, j], bw[i, j]))
        start = time.monotonic()
        err = holdout_error(list(range(n)), measurements, fraction=0.1, seed=seed)
        took = time.monotonic() - start
        caps = {i: AccessCapacity(state.net.upload_gbps[i], state.net.download_gbps[i]) for i in range(n)}
        with_caps = holdout_error(list(range(n)), measurements, caps, fraction=0.1, seed=seed)
        row = {
            "peers": n,
            "per_peer": per_peer,
            "held_out": err.held_out,
            "latency_median": err.latency_median,
            "latency_p90": err.latency_p90,
            "bandwidth_median": err.bandwidth_median,
            "bandwidth_p90": err.bandwidth_p90,
            "bandwidth_median_with_caps": with_caps.bandwidth_median,
            "fit_s": took,
        }
        rows.append(row)
        print(
            f"{n:>6} {per_peer:>8} {err.held_out:>8} {100 * err.latency_median:7.1f}% "
            f"{100 * err.latency_p90:7.1f}% {100 * err.bandwidth_median:7.1f}% "
            f"{100 * err.bandwidth_p90:7.1f}% {100 * with_caps.bandwidth_median:12.1f}% {took:6.2f}"
        )
    return rows


def bench_replan(n: int, seed: int, trials: int) -> list[dict]:
    state = random_swarm(n, seed)
    first, _ = plan(state, SCALE_JOB, 0.0, None, PlannerConfig(seed=seed, time_limit_s=25.0))
    assert first is not None
    rng = np.random.default_rng(seed)
    rows = []
    print(f"{'peers':>6} {'left':>6} {'repair s':>9} {'moved':>6} {'before s':>9} {'after s':>9}  reason")
    for _ in range(trials):
        row_i = int(rng.integers(0, first.n_stages))
        gone = first.stages[row_i][int(rng.integers(0, first.n_replicas))]
        keep = [k for k, p in enumerate(state.peers) if p != gone]
        after = PlanningState(
            tuple(state.peers[k] for k in keep), tuple(state.devices[k] for k in keep), state.net.subset(keep)
        )
        start = time.monotonic()
        repaired, reason = plan(after, SCALE_JOB, 1.0, first, PlannerConfig(seed=seed))
        took = time.monotonic() - start
        assert repaired is not None, reason
        rows.append(
            {
                "peers": n,
                "left": gone,
                "repair_s": took,
                "moved": repaired.detail["moved_peers"],
                "cost_before": first.cost,
                "cost_after": repaired.cost,
                "reason": reason,
            }
        )
        print(
            f"{n:>6} {gone!s:>6} {took:9.3f} {repaired.detail['moved_peers']:>6} {first.cost:9.3f} "
            f"{repaired.cost:9.3f}  {reason}"
        )
    return rows


def anneal(obj: DtfmObjective, groups: np.ndarray, seconds: float, seed: int) -> tuple[float, np.ndarray]:
    """Simulated annealing over partitions, every move scored exactly: group summaries, every boundary
    by ``obj.boundary`` (the exact directional matching), the best stage order by Held-Karp. A reference
    the planner must reach, slow on purpose (~3 ms a move at 8 x 6). Returns (best cost, its groups)."""
    rng = np.random.default_rng(seed)
    g = np.array(groups, dtype=np.int64)
    s, r = g.shape
    stats = [obj.group_stat(row) for row in g]
    pair = np.zeros((s, s))
    for a in range(s):
        for b in range(a + 1, s):
            pair[a, b] = pair[b, a] = obj.boundary(g[a], g[b])[0]

    def total(st: list, pw: np.ndarray) -> float:
        return obj.combine([max(st)], np.array([open_path(pw)[0]]))

    cost = total(stats, pair)
    best, best_g = cost, g.copy()
    start = time.monotonic()
    temp0 = 0.02 * cost
    while (elapsed := time.monotonic() - start) < seconds:
        temp = temp0 * (1e-3 ** (elapsed / seconds))  # geometric cooling to 0.1% of the start
        a, b = rng.choice(s, size=2, replace=False)
        i, k = rng.integers(0, r, size=2)
        g[a, i], g[b, k] = g[b, k], g[a, i]
        new_stats = list(stats)
        new_stats[a], new_stats[b] = obj.group_stat(g[a]), obj.group_stat(g[b])
        new_pair = pair.copy()
        for x in (a, b):
            for y in range(s):
                if y != x:
                    new_pair[x, y] = new_pair[y, x] = obj.boundary(g[x], g[y])[0]
        new_cost = total(new_stats, new_pair)
        if new_cost <= cost or rng.random() < math.exp((cost - new_cost) / max(temp, 1e-12)):
            cost, stats, pair = new_cost, new_stats, new_pair
            if cost < best:
                best, best_g = cost, g.copy()
        else:
            g[a, i], g[b, k] = g[b, k], g[a, i]
    return best, best_g


def bench_home(n: int, seeds: list[int], time_limit: float, anneal_s: float) -> list[dict]:
    """Asymmetric home swarms (potluck.testbed.homes): the directional ``dtfm`` objective against the
    same planner fed DT-FM's symmetric view of the links, and against long simulated annealing."""
    print(f"\n== Home swarms: {n} peers, asymmetric access links, --objective dtfm ==")
    print("seed  sym-predicted  sym-actual  directional  time s  anneal(ref)  anneal s  ratio  bound")
    rows = []
    for seed in seeds:
        sc = scenario_from_dict(home_swarm(n, seed))
        net, job = sc.state.net, sc.dtfm_job
        assert job is not None
        index = {p: i for i, p in enumerate(sc.state.peers)}
        bw = directed_bandwidth(net)
        sym = from_matrices((net.latency_ms + net.latency_ms.T) / 2, (bw + bw.T) / 2)
        old, _ = plan(
            PlanningState(sc.state.peers, sc.state.devices, sym),
            job,
            0.0,
            cfg=PlannerConfig(seed=seed, time_limit_s=time_limit),
        )
        t0 = time.monotonic()
        new, _ = plan(sc.state, job, 0.0, cfg=PlannerConfig(seed=seed, time_limit_s=time_limit))
        solve = time.monotonic() - t0
        assert old is not None and new is not None
        grid_old = np.array([[index[x] for x in row] for row in old.stages])
        grid_new = np.array([[index[x] for x in row] for row in new.stages])
        actual_old = dtfm_cost(grid_old, net, job).total
        actual_new = dtfm_cost(grid_new, net, job).total
        obj = DtfmObjective(net, job)
        # The reference: annealing from a random partition and from the planner's own answer, best kept.
        rng = np.random.default_rng(seed)
        ref_random, _ = anneal(
            obj,
            rng.permutation(n)[: job.n_stages * job.n_replicas].reshape(job.n_stages, job.n_replicas),
            anneal_s / 2,
            seed,
        )
        ref_polish, _ = anneal(obj, grid_new, anneal_s / 2, seed + 1)
        ref = min(ref_random, ref_polish)
        rows.append(
            {
                "seed": seed,
                "n": n,
                "symmetric_predicted_s": old.cost,
                "symmetric_actual_s": actual_old,
                "directional_s": actual_new,
                "directional_predicted_s": new.cost,
                "solve_s": solve,
                "anneal_random_s": ref_random,
                "anneal_from_plan_s": ref_polish,
                "reference_s": ref,
                "anneal_seconds": anneal_s,
                "ratio_to_reference": actual_new / ref,
                "lower_bound": new.lower_bound,
            }
        )
        print(
            f"{seed:4d}  {old.cost:13.1f}  {actual_old:10.1f}  {actual_new:11.1f}  {solve:6.1f}  "
            f"{ref:11.1f}  {anneal_s:8.0f}  {actual_new / ref:5.3f}  {new.lower_bound:6.1f}"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--only", choices=["dtfm", "small", "small-step", "netmodel", "scale", "replan", "home"], default=None
    )
    ap.add_argument("--home-seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--anneal-s", type=float, default=120.0, help="reference annealing per home swarm")
    ap.add_argument("--small-repeats", type=int, default=3)
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024, 4096])
    ap.add_argument("--time-limit", type=float, default=5.0, help="per DT-FM case, seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--replan-trials", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("bench-out/planner.json"))
    args = ap.parse_args()
    out: dict[str, object] = {}
    if args.only in (None, "dtfm"):
        out["dtfm"] = bench_dtfm(args.time_limit, args.seed)
    if args.only in (None, "small"):
        out["small"] = bench_small(args.seed, args.small_repeats)
    if args.only in (None, "small-step"):
        out["small_step"] = bench_small_step(args.seed, args.small_repeats)
    if args.only in (None, "netmodel"):
        out["netmodel"] = bench_netmodel([256, 1024], args.seed)
    if args.only in (None, "scale"):
        out["scale"] = bench_scale(args.sizes, args.seed)
    if args.only in (None, "replan"):
        out["replan"] = bench_replan(1024, args.seed, args.replan_trials)
    if args.only in (None, "home"):
        out["home"] = bench_home(48, args.home_seeds, args.time_limit, args.anneal_s)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
