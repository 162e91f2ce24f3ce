"""Compile every codec Triton kernel for sm_80 and sm_90 without a GPU and report its resources.

    python scripts/kernel_report.py [--json] [--block 64]

Per kernel variant and target: warps, registers, shared memory, spills, the occupancy those allow, and a
roofline time for 2^24 elements at the GPU's HBM bandwidth (potluck/compression/kernels/aot.py).
Compiling needs no device: Triton ships ptxas and cuobjdump. Run it without TRITON_INTERPRET.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON line: a list of per-kernel reports")
    ap.add_argument("--block", type=int, default=64, help="quantisation block (the codecs' default: 64)")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET"):
        raise SystemExit("unset TRITON_INTERPRET: the interpreter does not compile for a GPU")
    from potluck.compression.kernels.aot import TARGETS, report, variants

    rows = [report(v, cc) for v in variants(args.block) for cc in TARGETS]
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows]))
        return
    print(
        f"{'kernel':34} {'sm':>3} {'warps':>5} {'regs':>4} {'smem B':>6} {'spill':>5} {'occ':>5} "
        f"{'roofline us (2^24)':>19}"
    )
    for r in rows:
        print(
            f"{r.name:34} {r.cc:>3} {r.num_warps:>5} {r.registers:>4} {r.shared_bytes:>6} {r.spill_bytes:>5} "
            f"{r.occupancy:>5.2f} {r.roofline_us_16m:>19.1f}"
        )


if __name__ == "__main__":
    main()
