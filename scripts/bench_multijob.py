"""Multi-job allocation (Gavel) on Gavel's measured throughputs: acceptance G1-G4 of issue 18.

- G1: the HiGHS policies (max-min, makespan, max total throughput) against an independent formulation
  solved by exhaustive vertex enumeration (``allocation/reference.py``): Gavel's test instance
  (2 jobs, v100:1 / p100:2 / k80:3), its space-sharing instance, random 2 jobs x 2 classes and
  3 x 3 instances. Reported: the largest relative error of the objective.
- G2: ``--instances`` random instances drawn from the measured rates (2-8 jobs, 1-8 workers per class):
  the aware policy's objective against the agnostic one's (solved on rates averaged over classes, scored
  on the true ones), for each LP policy; failures (aware < agnostic) and the mean max-min gain.
- G3: 8 jobs on a 2:2:2 cluster, ``--rounds`` rounds of leases from ``allocate``; the largest gap between
  a realised time fraction and the allocation, over three seeds.
- G4: a ``--jobs`` Poisson trace (``--rate`` jobs/hour, Gavel's job types, scale factors ``--scales``) on
  a 36:36:36 K80/P100/V100 cluster, ``--round-s`` leases, a hand-off of ``--handoff-s`` charged to every
  lease whose peers changed: average JCT of heterogeneity-aware LAS over agnostic LAS; FIFO (aware and
  agnostic) printed too, and the ratio without hand-off charges.
- Space sharing (beyond G1-G4): a ``--ss-jobs`` trace of single-worker jobs at ``--ss-rate`` jobs/hour
  on a smaller ``--ss-workers`` per class cluster (oversubscribed: sharing pays only when jobs wait),
  aware LAS with every worker shareable (two jobs at Gavel's measured co-located rates of their types)
  over aware LAS without: ``ss_jct_ratio``.

    python scripts/bench_multijob.py [--data PATH] [--jobs 100] [--rate 4] [--seed 0] [--json]

With ``--json`` the last line is one JSON object with ``g1_max_rel_err``, ``g2_failures``,
``g2_mean_gain``, ``g3_max_dev``, ``g4_jct_ratio``, ``ss_jct_ratio``, the JCTs (hours), and ``wall_s``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from potluck.coordinator.allocation import AllocConfig, JobDemand, Throughput, allocate, make_problem, solve
from potluck.sim.cluster import (
    GAVEL_CLASSES,
    GavelTable,
    cluster,
    load_gavel,
    poisson_trace,
    random_problem,
    simulate,
)
from potluck.sim.lp_oracle import reference_objective

LP = ("max_min", "makespan", "max_throughput")
DEFAULT_DATA = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "gavel" / "simulation_throughputs.json"
)


def g1(rng: np.random.Generator) -> tuple[float, int]:
    cls = ["v100", "p100", "k80"]
    rates = [[2.0, 1.0, 0.5], [3.0, 2.0, 1.0]]
    cases = [
        make_problem(["0", "1"], cls, [1, 2, 3], rates, remaining=[300, 500]),
        make_problem(
            ["0", "1"],
            cls,
            [1, 1, 1],
            rates,
            remaining=[300, 500],
            pairs=[(0, 1)],
            pair_rates=[[[2.0, 3.0], [1.0, 2.0], [0.5, 1.0]]],
            shareable=[True] * 3,
        ),
    ]
    for m, k, n in ((2, 2, 40), (3, 3, 5)):
        for _ in range(n):
            cases.append(
                make_problem(
                    [f"j{i}" for i in range(m)],
                    [f"c{j}" for j in range(k)],
                    rng.integers(1, 4, k),
                    rng.uniform(0.0, 5.0, (m, k)),
                    remaining=rng.uniform(10, 1e4, m),
                    weights=rng.choice([1.0, 2.0, 3.0], m),
                )
            )
    worst = 0.0
    for p in cases:
        for policy in LP:
            ref = reference_objective(p, policy)
            worst = max(worst, abs(solve(p, policy).objective - ref) / max(abs(ref), 1e-12))
    return worst, len(cases) * len(LP)


def g2(rng: np.random.Generator, table: GavelTable, n: int) -> dict[str, float]:
    failures = 0
    gains: dict[str, list[float]] = {p: [] for p in LP}
    for _ in range(n):
        p = random_problem(rng, table)
        for policy in LP:
            aware, blind = solve(p, policy).objective, solve(p, policy, aware=False).objective
            failures += aware < blind * (1 - 1e-6)
            gains[policy].append(aware / blind - 1 if blind > 0 else 0.0)
    out = {"g2_failures": failures, "g2_mean_gain": float(np.mean(gains["max_min"]))}
    out.update({f"g2_mean_gain_{p}": float(np.mean(gains[p])) for p in LP})
    return out


def g3(table: GavelTable, rounds: int) -> float:
    worst = 0.0
    counts = {"k80": 2, "p100": 2, "v100": 2}
    for seed in range(3):
        rng = np.random.default_rng(seed)
        types = table.types()
        jobs = [JobDemand(f"job-{i}", weight=float(rng.choice([1.0, 2.0]))) for i in range(8)]
        kinds = [types[int(i)] for i in rng.integers(0, len(types), len(jobs))]
        tp = Throughput(
            {(j.job, c): table.single[(t, 1)][c] for j, t in zip(jobs, kinds, strict=True) for c in counts}
        )
        peers, cfg, prev = cluster(counts), AllocConfig(round_s=360.0, handoff_s=30.0), None
        for r in range(rounds + 1):
            prev, _ = allocate(r * 360.0, jobs, peers, tp, cfg, prev)
        assert prev is not None
        worst = max(
            worst,
            *(abs(s.received_s / row.present_s - s.allocation) for row in prev.rows for s in row.shares),
        )
    return worst


def g4(table: GavelTable, args: argparse.Namespace) -> dict[str, float]:
    scales = {int(a): float(b) for a, b in (part.split(":") for part in args.scales.split(","))}
    trace = poisson_trace(np.random.default_rng(args.seed), table, args.jobs, args.rate, scales)
    peers = cluster({c: 36 for c in GAVEL_CLASSES})
    out: dict[str, float] = {}
    runs = {
        "las_aware": AllocConfig(policy="las", round_s=args.round_s, handoff_s=args.handoff_s),
        "las_agnostic": AllocConfig(
            policy="las", aware=False, round_s=args.round_s, handoff_s=args.handoff_s
        ),
        "fifo_aware": AllocConfig(policy="fifo", round_s=args.round_s, handoff_s=args.handoff_s),
        "fifo_agnostic": AllocConfig(
            policy="fifo", aware=False, round_s=args.round_s, handoff_s=args.handoff_s
        ),
        "las_aware_free": AllocConfig(policy="las", round_s=args.round_s, handoff_s=0.0),
        "las_agnostic_free": AllocConfig(policy="las", aware=False, round_s=args.round_s, handoff_s=0.0),
    }
    for name, cfg in runs.items():
        t0 = time.perf_counter()
        res = simulate(trace, table, peers, cfg)
        out[f"jct_h_{name}"] = res.mean_jct / 3600.0
        done = len(res.jct)
        print(
            f"G4 {name:18s} mean JCT {res.mean_jct / 3600:7.2f} h  finished {done}/{len(trace)}  "
            f"rounds {res.rounds}  solves {res.solves}  lease changes {res.moves}  "
            f"{time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    out["g4_jct_ratio"] = out["jct_h_las_aware"] / out["jct_h_las_agnostic"]
    out["g4_jct_ratio_no_handoff"] = out["jct_h_las_aware_free"] / out["jct_h_las_agnostic_free"]
    return out


def space_sharing(table: GavelTable, args: argparse.Namespace) -> dict[str, float]:
    trace = poisson_trace(np.random.default_rng(args.seed), table, args.ss_jobs, args.ss_rate, {1: 1.0})
    counts = {c: args.ss_workers for c in GAVEL_CLASSES}
    out: dict[str, float] = {}
    for name, shared in (("las_aware_time_sliced", False), ("las_aware_space_shared", True)):
        t0 = time.perf_counter()
        cfg = AllocConfig(policy="las", round_s=args.round_s, handoff_s=args.handoff_s)
        res = simulate(trace, table, cluster(counts, shareable=shared), cfg)
        out[f"ss_jct_h_{name}"] = res.mean_jct / 3600.0
        print(
            f"SS {name:24s} mean JCT {res.mean_jct / 3600:7.2f} h  finished {len(res.jct)}/{len(trace)}  "
            f"shared leases {res.shared_rounds}  {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    out["ss_jct_ratio"] = out["ss_jct_h_las_aware_space_shared"] / out["ss_jct_h_las_aware_time_sliced"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Gavel's simulation_throughputs.json")
    ap.add_argument("--instances", type=int, default=200, help="G2 random instances")
    ap.add_argument("--rounds", type=int, default=500, help="G3 rounds")
    ap.add_argument("--jobs", type=int, default=100, help="G4 trace length")
    ap.add_argument("--rate", type=float, default=4.0, help="G4 arrivals, jobs per hour")
    ap.add_argument("--scales", default="1:0.7,2:0.1,4:0.15,8:0.05", help="G4 scale factor: probability")
    ap.add_argument("--round-s", type=float, default=360.0, help="lease length, seconds (Gavel's 360)")
    ap.add_argument("--handoff-s", type=float, default=30.0, help="seconds a lease change costs the job")
    ap.add_argument("--ss-jobs", type=int, default=100, help="space sharing: trace length (1-worker jobs)")
    ap.add_argument("--ss-rate", type=float, default=6.0, help="space sharing: arrivals, jobs per hour")
    ap.add_argument("--ss-workers", type=int, default=8, help="space sharing: workers per class")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    start = time.perf_counter()
    table = load_gavel(json.loads(args.data.read_text()))
    rng = np.random.default_rng(args.seed)
    err, checked = g1(rng)
    print(
        f"G1 max relative error {err:.2e} over {checked} (instance, policy) pairs (target <= 1e-6)",
        flush=True,
    )
    summary: dict[str, float] = {"g1_max_rel_err": err}
    summary.update(g2(rng, table, args.instances))
    print(
        f"G2 failures {summary['g2_failures']} of {args.instances} x {len(LP)}; mean gain max-min "
        f"{summary['g2_mean_gain']:.1%}, makespan {summary['g2_mean_gain_makespan']:.1%}, "
        f"max throughput {summary['g2_mean_gain_max_throughput']:.1%}",
        flush=True,
    )
    summary["g3_max_dev"] = g3(table, args.rounds)
    print(
        f"G3 max |realised - X| after {args.rounds} rounds: {summary['g3_max_dev']:.4f} (target <= 0.05)",
        flush=True,
    )
    summary.update(g4(table, args))
    print(
        f"G4 LAS aware / agnostic mean JCT {summary['g4_jct_ratio']:.3f} (target <= 0.8); without hand-off "
        f"charges {summary['g4_jct_ratio_no_handoff']:.3f}",
        flush=True,
    )
    summary.update(space_sharing(table, args))
    print(
        f"SS LAS space-shared / time-sliced mean JCT {summary['ss_jct_ratio']:.3f} "
        f"({args.ss_workers} workers per class, {args.ss_jobs} jobs at {args.ss_rate:g}/h)",
        flush=True,
    )
    summary["wall_s"] = time.perf_counter() - start
    print(f"wall {summary['wall_s']:.1f} s", flush=True)
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
