"""How late the event loop wakes up beside the check worker, by the worker's nice value (issue 38, item 4).

The recomputation checks run on one worker thread at a lowered priority (``peer/train/checks/idle.py``).
That thread shares the interpreter lock with the event loop, so a priority set too low makes the loop
wait whenever the kernel preempts the worker while it holds the lock. Each row runs, in a child
process of its own: an asyncio loop doing bursts of torch work (a small model's forward and backward,
20 per burst) with a 2 ms sleep between them, and beside it ``in_idle_time`` replaying another small
model for as long as the loop runs, at the row's nice value ("none": no worker). ``--hogs`` busy
processes at normal priority keep the cores loaded, as the other peers and tests of a busy machine do.

Reported per row: how late the 2 ms sleep wakes up (p99 and max, ms), the burst time (median, ms) and
how many replays the worker finished (its share of the CPU).

    python scripts/bench_idle_priority.py --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import sys
import time
from typing import Any

BURST = 20  # forward + backward passes between two sleeps of the loop
SLEEP_S = 0.002


def _hog() -> None:
    while True:
        pass


def _row(nice: int | None, seconds: float, out: Any) -> None:
    import torch

    from potluck.peer.train.checks import idle

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
    other = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
    stop = False

    def replay() -> int:
        done = 0
        while not stop:
            other(torch.randn(16, 64)).sum().backward()
            done += 1
        return done

    async def run() -> dict[str, float]:
        nonlocal stop
        worker = None
        if nice is not None:
            idle.NICE = nice
            worker = asyncio.ensure_future(idle.in_idle_time(replay))
        bursts, late = [], []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            for _ in range(BURST):
                model(torch.randn(16, 64)).sum().backward()
            t1 = time.perf_counter()
            await asyncio.sleep(SLEEP_S)
            late.append(time.perf_counter() - t1 - SLEEP_S)
            bursts.append(t1 - t0)
        stop = True
        replays = await worker if worker is not None else 0
        late.sort()
        return {
            "late_p99_ms": round(late[int(0.99 * (len(late) - 1))] * 1e3, 1),
            "late_max_ms": round(late[-1] * 1e3, 1),
            "burst_median_ms": round(statistics.median(bursts) * 1e3, 1),
            "replays": replays,
        }

    out.put(asyncio.run(run()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nice", default="none,0,5,10,19", help="comma-separated nice values; none: no worker")
    ap.add_argument("--hogs", type=int, default=3, help="busy processes at normal priority beside each row")
    ap.add_argument("--seconds", type=float, default=8.0, help="per row")
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    args = ap.parse_args()
    ctx = mp.get_context("fork")
    rows: dict[str, dict[str, float]] = {}
    hogs = [ctx.Process(target=_hog, daemon=True) for _ in range(args.hogs)]
    for p in hogs:
        p.start()
    try:
        for value in args.nice.split(","):
            nice = None if value.strip() == "none" else int(value)
            out = ctx.Queue()
            child = ctx.Process(target=_row, args=(nice, args.seconds, out))
            child.start()
            rows[value.strip()] = out.get(timeout=args.seconds + 60)
            child.join(timeout=30)
            print(f"nice {value.strip():>4}: {rows[value.strip()]}", file=sys.stderr)
    finally:
        for p in hogs:  # ours, by handle (PID)
            p.terminate()
        for p in hogs:
            p.join(timeout=5)
    if args.json:
        print(json.dumps({"hogs": args.hogs, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
