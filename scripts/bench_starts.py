#!/usr/bin/env python
"""Starts of the tiny job in a row: coordinator + 2 peers on 127.0.0.1, each peer announcing a dead port
before its real one, one training step, then everything is stopped and reaped (issue 12, item 4).

    .venv/bin/python scripts/bench_starts.py                # 20 starts
    .venv/bin/python scripts/bench_starts.py --starts 5 --steps 2

Prints one line per start and a JSON summary: starts that reached the last step, starts that needed a
re-plan, dial errors seen in the peers' logs, and the seconds per start. Exits 1 unless every start
reached its last step under its first plan (the rate tests/integration/swarm/test_dial_retries.py
leaves to this benchmark: it runs one start).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's potluck

from potluck.testbed.harness.starts import start_tiny_job


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starts", type=int, default=20)
    ap.add_argument("--steps", type=int, default=1, help="steps each start trains before the job ends")
    ap.add_argument("--run-dir", type=Path, default=None, help="keep logs here (default: a temp dir)")
    args = ap.parse_args()
    root = args.run_dir or Path(tempfile.mkdtemp(prefix="potluck-starts-"))
    results = []
    for i in range(args.starts):
        r = start_tiny_job(root / f"start-{i:02d}", f"bench-start-{i}", steps=args.steps)
        results.append(r)
        print(
            f"start {i + 1:2d}/{args.starts}: {'ok' if r.ok else 'FAILED'}  plans {r.plans}  "
            f"dial errors {r.dial_errors}  {r.seconds:.1f} s",
            flush=True,
        )
        if not r.ok:
            print(r.tail, flush=True)
    summary = {
        "starts": len(results),
        "ok": sum(r.ok for r in results),
        "replanned": sum(r.plans > 1 for r in results),
        "dial_errors": sum(r.dial_errors for r in results),
        "seconds_median": round(statistics.median(r.seconds for r in results), 1),
        "run_dir": str(root),
    }
    print(json.dumps(summary), flush=True)
    return 0 if summary["ok"] == len(results) and summary["replanned"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
