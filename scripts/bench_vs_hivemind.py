#!/usr/bin/env python3
"""potluck's tree all-reduce vs hivemind's DecentralizedAverager (butterfly) on the same shaped links.

Every peer is a process in its own network namespace (potluck/testbed/netem.py), joined to the others by a
veth pair and a bridge; tc tbf qdiscs cap each peer's upload (and optionally its download), htb
classes optionally cap single pairs. Each peer runs one hivemind DHT (one p2pd daemon, listening on the
namespace's address) and uses it for both systems:

- hivemind: ``DecentralizedAverager`` (fp32, no compression, group size N, ``bandwidth`` = the peer's
  known cap, so its butterfly load balancing knows what the tree planner knows). Matchmaking runs
  first (``require_trigger``); the all-reduce is timed from the trigger to the last peer's result;
- potluck tree: ``tree_allreduce`` over a ``Mailbox`` on the same daemon, with the plan
  ``choose_tree_plan`` on the known caps (packed trees or one-hop stars, by the time model);
- potluck ring: ``ring_allreduce`` over the same mailbox, on the heaviest ring of ``pack_rings``.

Topologies per group size N (default 4 and 8): unshaped (the CPU floor: 2 cores shared by every
process; shaped times well above it mean the links, not the CPU, set the pace), uniform upload caps,
random node-capacitated caps (lognormal, clipped, one or two fast peers; ``--seeds``), and two sites
(per-pair caps across the sites, which hivemind's per-peer ``bandwidth`` cannot express).

Times are wall clock at the driver, from the "go" sent to every peer to the last peer's reply (medians
of ``--reps``, interleaved hivemind/tree/ring). Every peer checks its result against the true mean (max
abs diff); a wrong result is reported and left out of the medians. The "model" columns are
potluck.coordinator.trees.plan.predict_allreduce_time on the shaped rates times the TCP/IP goodput
factor 1448/1514 (hivemind: its own butterfly shares, scored as stars). JSON with every run:
bench-out/bench_vs_hivemind.json.

Needs root (namespaces, veth, tc). Cleans up its namespaces and processes on exit, Ctrl-C or SIGTERM.

    sudo .venv/bin/python scripts/bench_vs_hivemind.py [--quick] [--mbytes 16] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _avg_plans import Topology, make_plans, make_topologies
from _avg_swarm import Swarm
from _avg_worker import worker_main

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

MIB = 1 << 20
METHODS = ("hivemind", "tree", "ring")
TOLERANCE = 1e-4  # max |result - true mean| accepted (fp32 sums of N unit normals: ~1e-6)


# ==== topologies =========================================================================================


# ==== worker (one per namespace) =========================================================================


# ==== driver =============================================================================================


def run_topology(swarm: Swarm, topo: Topology, args: argparse.Namespace, reps: int) -> dict[str, Any]:
    n = swarm.lab.n
    nbytes = args.elements * 4
    plans = make_plans(topo, n, nbytes, args.chunk)
    swarm.lab.shape(topo.up, topo.down, topo.pair)
    worst = max(plans.tree_model_s, plans.ring_model_s, plans.hm_model_s) if topo.shaped else 10.0
    timeout = 10 * worst + 60
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
    # A ring far slower than the tree (two sites: it crosses the slow links) runs once, to save time.
    ring_reps = reps if plans.ring_model_s <= 3 * plans.tree_model_s or not topo.shaped else 1
    for k in range(reps):  # interleaved, so background load hits every method alike
        for m in METHODS:
            if m not in args.methods or (m == "ring" and k >= ring_reps):
                continue
            r = swarm.hivemind(plans, timeout) if m == "hivemind" else swarm._go(m, plans, timeout, 0.0)
            if r["err"] > TOLERANCE or r["warnings"]:
                print(
                    f"    {m} run {k}: max err {r['err']:.2e}; peer log warnings: {r['warnings']}", flush=True
                )
            runs[m].append(r)
    row: dict[str, Any] = {
        "n": n,
        "topology": topo.name,
        "note": topo.note,
        "up_mbit": topo.up,
        "down_mbit": topo.down,
        "pair_mbit": {f"{u}-{v}": r for (u, v), r in topo.pair.items()},
        "mbytes": nbytes / MIB,
        "trees": plans.trees,
        "tree_rate_mbit": plans.rate_mbit,
        "bound_mbit": plans.bound_mbit,
        "tree_model_s": plans.tree_model_s if topo.shaped else None,
        "ring_model_s": plans.ring_model_s if topo.shaped else None,
        "hm_model_s": plans.hm_model_s if topo.shaped else None,
        "runs": runs,
    }
    for m, rs in runs.items():
        ok = [r for r in rs if r["err"] <= TOLERANCE]  # a wrong result is no timing
        row[f"{m}_s"] = statistics.median(r["s"] for r in ok) if ok else None
        row[f"{m}_runs"] = len(rs)
        row[f"{m}_wrong"] = len(rs) - len(ok)
        row[f"{m}_err"] = max((r["err"] for r in rs), default=None)
        row[f"{m}_cpu"] = statistics.median(r["cpu"] for r in ok) if ok else None
        row[f"{m}_cores"] = statistics.median(r["peer_cores"] for r in ok) if ok else None
    hm_ok = [r for r in runs["hivemind"] if r["err"] <= TOLERANCE]
    row["hm_step_s"] = statistics.median(r["s"] + r["match_s"] for r in hm_ok) if hm_ok else None
    row["hm_over_tree"] = _ratio(row["hivemind_s"], row["tree_s"])
    row["ring_over_tree"] = _ratio(row["ring_s"], row["tree_s"])
    return row


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def _f(v: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def caps_text(row: dict[str, Any]) -> str:
    if all(u is None for u in row["up_mbit"]):
        return "none"
    ups = [u for u in row["up_mbit"] if u is not None]
    text = f"{ups[0]:g} each" if len(set(ups)) == 1 else "/".join(f"{u:g}" for u in ups)
    if row["pair_mbit"]:
        text += f"; cross {next(iter(row['pair_mbit'].values())):g}"
    downs = [d for d in row["down_mbit"] or [] if d is not None]
    if downs:
        text += "; down " + (
            f"{downs[0]:g} each" if len(set(downs)) == 1 else "/".join(f"{d:g}" for d in downs)
        )
    return text


def progress(row: dict[str, Any], elapsed: float) -> None:
    models = "/".join(_f(row[k]) for k in ("hm_model_s", "tree_model_s", "ring_model_s"))
    cores = "/".join(_f(row[f"{m}_cores"]) for m in METHODS)
    print(
        f"  {row['topology']:22s} hivemind {_f(row['hivemind_s'])} s  tree {_f(row['tree_s'])} s  "
        f"ring {_f(row['ring_s'])} s  (model {models})  hm/tree {_f(row['hm_over_tree'], '.2f', 'x')}  "
        f"cores {cores}  [{elapsed:.0f} s]",
        flush=True,
    )


def table(rows: list[dict[str, Any]], floor: dict[int, dict[str, float | None]]) -> str:
    head = (
        "| N | topology | upload caps (Mbit/s) | hivemind s | tree s | ring s | hivemind / tree | "
        "hivemind model s | tree model s | ring model s | trees | peers' CPU, cores (hm/tree/ring) | "
        "machine busy (hm/tree/ring) | max err (hm/tree/ring) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        near = []
        for m in METHODS:
            cpu_floor = floor.get(r["n"], {}).get(m)
            if r["tree_model_s"] is not None and cpu_floor and r[f"{m}_s"] and r[f"{m}_s"] < 1.5 * cpu_floor:
                near.append(m)
        cores = "/".join(_f(r[f"{m}_cores"]) for m in METHODS)
        if near:
            cores += " (near the CPU floor: " + ", ".join(near) + ")"
        busy = "/".join(_f(None if r[f"{m}_cpu"] is None else 100 * r[f"{m}_cpu"], ".0f") for m in METHODS)
        errs = []
        for m in METHODS:
            e = _f(r[f"{m}_err"], ".1e")
            if r[f"{m}_wrong"]:
                e += f" (wrong in {r[f'{m}_wrong']} of {r[f'{m}_runs']} runs)"
            errs.append(e)
        times = []
        for m in METHODS:
            t = _f(r[f"{m}_s"])
            if r[f"{m}_runs"] and r[f"{m}_runs"] != r["hivemind_runs"]:
                t += f" ({r[f'{m}_runs']} run{'s' if r[f'{m}_runs'] > 1 else ''})"
            times.append(t)
        lines.append(
            f"| {r['n']} | {r['topology']} | {caps_text(r)} | {' | '.join(times)} | "
            f"{_f(r['hm_over_tree'], '.2f', 'x')} | {_f(r['hm_model_s'])} | {_f(r['tree_model_s'])} | "
            f"{_f(r['ring_model_s'])} | {r['trees']} | {cores} | {busy}% | {' / '.join(errs)} |"
        )
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0], allow_abbrev=False)
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: N=4, 4 MiB, uniform + one random seed, 1 rep"
    )
    ap.add_argument("--peers", type=int, nargs="+", default=None, help="group sizes (default 4 8)")
    ap.add_argument("--mbytes", type=float, default=None, help="fp32 MiB per peer (default 16; quick 4)")
    ap.add_argument(
        "--reps", type=int, default=None, help="timed repetitions per method (default 3; quick 1)"
    )
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="random-cap seeds (default 1 2)")
    ap.add_argument("--uniform", type=float, default=50.0, help="Mbit/s of every peer in the uniform case")
    ap.add_argument("--median", type=float, default=60.0, help="random caps: lognormal median, Mbit/s")
    ap.add_argument("--sigma", type=float, default=0.6, help="random caps: lognormal sigma")
    ap.add_argument("--min-cap", type=float, default=25.0, help="random caps: clipped below at this (Mbit/s)")
    ap.add_argument(
        "--max-cap", type=float, default=200.0, help="random caps: clipped above at this (Mbit/s)"
    )
    ap.add_argument("--fast", type=float, default=300.0, help="Mbit/s of the fast peers (1 if N<=4, else 2)")
    ap.add_argument(
        "--two-site",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add a two-site case (per-pair htb caps across sites); default on unless --quick",
    )
    ap.add_argument("--two-site-up", type=float, default=100.0, help="two-site case: every peer's upload cap")
    ap.add_argument("--cross", type=float, default=10.0, help="two-site case: Mbit/s of each cross-site pair")
    ap.add_argument(
        "--down-factor",
        type=float,
        default=0.0,
        help="download cap = this x upload cap (0: no download caps; every method's per-peer "
        "traffic is symmetric, so a download cap >= the upload cap never binds)",
    )
    ap.add_argument(
        "--queue-ms",
        type=float,
        default=100.0,
        help="every shaped queue holds at most this many ms of data at its rate (tbf latency)",
    )
    ap.add_argument(
        "--chunk",
        type=int,
        default=1 << 17,
        help="potluck: elements per pipeline step over all trees (default 2^17 = 512 KiB, "
        "hivemind's part size; potluck's own default is 2^18)",
    )
    ap.add_argument("--matchmaking-s", type=float, default=2.0, help="hivemind min_matchmaking_time")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-wait timeout inside the collectives")
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument(
        "--hivemind-debug", action="store_true", help="HIVEMIND_LOGLEVEL=DEBUG in the peers (big logs)"
    )
    ap.add_argument(
        "--methods", default=",".join(METHODS), help="comma-separated subset of hivemind,tree,ring"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "bench_vs_hivemind.json")
    ap.add_argument(
        "--keep-logs", action="store_true", help="keep the per-peer logs (kept anyway on failure)"
    )
    # worker mode (internal)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--addr", default="", help=argparse.SUPPRESS)
    ap.add_argument("--elements", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--boot", default="[]", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return args
    args.peers = args.peers or ([4] if args.quick else [4, 8])
    args.mbytes = args.mbytes or (4.0 if args.quick else 16.0)
    args.reps = args.reps or (1 if args.quick else 3)
    args.seeds = args.seeds if args.seeds is not None else ([1] if args.quick else [1, 2])
    args.two_site = (not args.quick) if args.two_site is None else args.two_site
    args.elements = int(args.mbytes * MIB) // 4
    args.methods = tuple(m for m in args.methods.split(",") if m)
    if not args.methods or set(args.methods) - set(METHODS):
        ap.error(f"--methods takes a subset of {','.join(METHODS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.worker:
        worker_main(args)
        return
    from potluck.testbed.netem import Netlab, require_root

    require_root("bench_vs_hivemind.py")

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, on_signal)  # also when started with SIGINT ignored (background jobs)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    logdir = Path(tempfile.mkdtemp(prefix="bench_vs_hivemind-"))
    rows: list[dict[str, Any]] = []
    floor: dict[int, dict[str, float | None]] = {}
    ok = False
    started = time.perf_counter()
    print(
        f"payload {args.mbytes:g} MiB fp32 per peer, {args.reps} rep(s) per method, logs in {logdir}",
        flush=True,
    )
    try:
        for n in args.peers:
            lab = Netlab(n, queue_ms=args.queue_ms)
            swarm = Swarm(lab, args, logdir)
            try:
                lab.create()
                t0 = time.perf_counter()
                swarm.start()
                print(f"N={n}: {n} peers up in {time.perf_counter() - t0:.1f} s", flush=True)
                for k, topo in enumerate(make_topologies(n, args)):
                    if k == 0:  # warm-up: streams opened, allocations made, averager's first round
                        run_topology(swarm, topo, args, 1)
                    row = run_topology(swarm, topo, args, args.reps)
                    if k == 0:
                        floor[n] = {m: row[f"{m}_s"] for m in METHODS}
                    rows.append(row)
                    progress(row, time.perf_counter() - started)
            finally:
                swarm.stop(graceful=sys.exc_info()[0] is None)  # not while an exception propagates
                lab.close()
                left = lab.leftovers()
                if left:
                    print(f"WARNING: namespaces left behind: {left}", file=sys.stderr)
        ok = True
    except KeyboardInterrupt:
        print("\ninterrupted; namespaces and peer processes removed", file=sys.stderr)
        sys.exit(130)
    finally:
        wrong = any(r[f"{m}_wrong"] for r in rows for m in METHODS)
        if not ok or wrong or args.keep_logs:
            print(f"peer logs kept in {logdir}", file=sys.stderr)
        else:
            for f in logdir.iterdir():
                f.unlink()
            logdir.rmdir()
    print()
    print(table(rows, floor))
    bad = [f"N={r['n']} {r['topology']} {m}" for r in rows for m in METHODS if r[f"{m}_wrong"]]
    print(
        f"\ncorrectness (max |result - true mean| <= {TOLERANCE:g} on every peer): "
        + ("every run" if not bad else "WRONG RESULTS in " + "; ".join(bad) + " (left out of the medians)")
    )
    print(f"total {time.perf_counter() - started:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
