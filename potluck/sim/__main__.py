"""``potluck sim`` (or ``python -m potluck.sim``): run the swarm simulator from a shell.

    potluck sim run --peers 1000 --hours 2 --policy repair [--churn-aware] [--csv out.csv] [--plot out.png]
    potluck sim dht --peers 1000 3000 10000 [--plot dht.png]
    potluck sim replay [--trace run.json]

Each prints one JSON object (a summary) on its last line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from potluck.sim.coordinator import POLICIES
from potluck.sim.dht import measure
from potluck.sim.errors import SimError
from potluck.sim.plot import dht_png, throughput_png
from potluck.sim.reference import reference
from potluck.sim.replay import REFERENCE_RUN, load_run, replay
from potluck.sim.report import summarize, write_csv
from potluck.sim.run import RunConfig, simulate

logger = logging.getLogger(__name__)


def _run(args: argparse.Namespace) -> dict[str, object]:
    setup = reference(args.peers, args.hours, args.seed)
    cfg = RunConfig(
        policy=args.policy,
        churn_aware=args.churn_aware,
        hours=args.hours,
        pool=args.pool,
        background_handoff=args.background_handoff,
        equal_search=args.equal_search,
    )
    t0 = time.perf_counter()
    res = simulate(
        setup.pop, setup.trace, setup.job, cfg, setup.planner, np.random.default_rng(args.seed), setup.fresh
    )
    out = {"peers": args.peers, **summarize(res, time.perf_counter() - t0)}
    if args.csv:
        out["csv"] = str(write_csv(res, Path(args.csv)))
    if args.plot:
        title = f"{args.peers} peers, {args.hours:g} h, policy {args.policy}"
        out["plot"] = str(throughput_png({args.policy: res}, Path(args.plot), title))
    return out


def main(argv: list[str] | None = None, prog: str = "python -m potluck.sim") -> int:
    ap = argparse.ArgumentParser(prog=prog, description="The swarm simulator (docs/sim.md).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one simulated run of the reference job and churn trace")
    r.add_argument("--peers", type=int, default=1000, help="live volunteers at any time (about)")
    r.add_argument("--hours", type=float, default=2.0)
    r.add_argument("--policy", choices=POLICIES, default="repair")
    r.add_argument("--churn-aware", action="store_true", help="liveput: plan for peers likely to stay")
    r.add_argument("--equal-search", action="store_true", help="churn-blind, searching liveput's pools")
    r.add_argument("--background-handoff", action="store_true", help="train on while newcomers fetch")
    r.add_argument("--pool", type=int, default=96, help="peers the coordinator plans over")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--csv", default="", help="write tokens/s over time here")
    r.add_argument("--plot", default="", help="write a PNG of tokens/s and the fraction kept here")
    d = sub.add_parser("dht", help="Kademlia traffic per peer at each size")
    d.add_argument("--peers", type=int, nargs="+", default=[1000, 3000, 10000])
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--plot", default="", help="write a PNG of the load against N here")
    p = sub.add_parser("replay", help="replay a bench_churn.py --json run and compare its throughput")
    p.add_argument("--trace", default=str(REFERENCE_RUN))
    p.add_argument("--fast-detect-share", type=float, default=0.3)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.cmd == "run":
        out: object = _run(args)
    elif args.cmd == "dht":
        rows = [measure(n, np.random.default_rng(args.seed)) for n in args.peers]
        if args.plot:
            dht_png(rows, Path(args.plot))
        out = rows
    else:
        out = replay(load_run(Path(args.trace)), fast_detect_share=args.fast_detect_share)
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except SimError as e:  # a message the user can act on, not a traceback
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(2) from None
