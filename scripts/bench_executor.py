#!/usr/bin/env python3
"""All-reduce executor on shaped links: measured time vs the planner's model, and tree vs ring.

Peers are real p2pd daemons on 127.0.0.1 in one process; an in-process shaper paces every send to the
link and per-peer rates of the topology (potluck.peer.shaping), so measured times can be compared with
potluck.coordinator.collective_plan.predict_allreduce_time on the same capacities.

    python scripts/bench_executor.py [--mbytes 8] [--quick] [--out bench-out/bench_executor.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from potluck.coordinator.collective_plan import predict_allreduce_time, ring_plan, tree_plan  # noqa: E402
from potluck.coordinator.topologies import lognormal_graph  # noqa: E402
from potluck.coordinator.trees import pack_allreduce  # noqa: E402
from potluck.coordinator.trees.rings import pack_rings  # noqa: E402
from potluck.peer.collectives import AllReduceConfig, ring_allreduce, tree_allreduce  # noqa: E402
from potluck.peer.shaping import LinkShaper  # noqa: E402
from potluck.peer.transport import Mailbox, TransportConfig  # noqa: E402
from potluck.protocol.collective import AllReduceSchedule, TreeSpec  # noqa: E402
from tests.helpers.p2p import p2p_group  # noqa: E402

MB = 1 << 20


def fragmented(n: int, fast: float, slow: float) -> np.ndarray:
    """Two clusters of n/2 peers: `fast` bytes/s inside a cluster, `slow` across (every pair linked)."""
    half = n // 2
    cap = np.full((n, n), slow)
    cap[:half, :half] = fast
    cap[half:, half:] = fast
    np.fill_diagonal(cap, 0.0)
    return cap


def topologies(quick: bool) -> list[tuple[str, np.ndarray]]:
    out = [("fragmented-6 (8 / 1 MB/s)", fragmented(6, 8 * MB, 1 * MB))]
    if not quick:
        out.append(("lognormal-6 (median 4 MB/s)", lognormal_graph(6, seed=3, sigma=0.7, median=4 * MB)))
        out.append(("fragmented-8 (8 / 1 MB/s)", fragmented(8, 8 * MB, 1 * MB)))
    return out


async def run_case(name: str, cap: np.ndarray, nbytes: int, chunk_elements: int) -> dict[str, Any]:
    n = cap.shape[0]
    nodes = list(range(n))
    packing = pack_allreduce(cap)
    tplan = tree_plan(nodes, packing.trees)
    rings = pack_rings(cap)
    weight, order = max(rings.rings, key=lambda r: r[0])
    rplan = ring_plan(nodes, [(weight, order)])
    chunk_bytes = chunk_elements * 4
    async with p2p_group(n) as p2ps:
        ids = [p.peer_id.to_base58() for p in p2ps]
        rates = {(ids[u], ids[v]): float(cap[u, v]) for u in nodes for v in nodes if cap[u, v] > 0}
        shaper = LinkShaper(rates)
        tcfg = TransportConfig(timeout_s=120)
        boxes = [Mailbox(p, "potluck/bench/allreduce/1", tcfg, shaper) for p in p2ps]
        for box in boxes:
            await box.start()
        schedule = AllReduceSchedule(
            tuple(ids),
            tuple(
                TreeSpec(
                    ids[t.root],
                    {ids[c]: ids[p] if p is not None else None for c, p in t.parent.items()},
                    t.share,
                )
                for t in tplan.trees
            ),
        )
        ring_order = tuple(ids[i] for i in order)
        x = [torch.randn(nbytes // 4) for _ in nodes]
        cfg = AllReduceConfig(chunk_elements=chunk_elements, timeout_s=120)

        async def timed(make: Any, round_no: int) -> float:
            start = time.perf_counter()
            await asyncio.gather(*(make(b, xi, round_no) for b, xi in zip(boxes, x, strict=True)))
            return time.perf_counter() - start

        def tree(b: Mailbox, xi: torch.Tensor, r: int) -> Any:
            return tree_allreduce(b, schedule, xi, r, cfg)

        def ring(b: Mailbox, xi: torch.Tensor, r: int) -> Any:
            return ring_allreduce(b, ring_order, xi, r, cfg)

        await timed(tree, 0)  # warm-up: streams opened, allocations made
        tree_s = min([await timed(tree, 1), await timed(tree, 2)])
        await timed(ring, 3)
        ring_s = min([await timed(ring, 4), await timed(ring, 5)])
        for box in boxes:
            await box.close()
    tree_model = predict_allreduce_time(tplan, nbytes, cap, chunk_bytes=chunk_bytes)
    ring_model = predict_allreduce_time(rplan, nbytes, cap, chunk_bytes=chunk_bytes)
    return {
        "topology": name, "peers": n, "mbytes": nbytes / MB, "trees": len(tplan.trees),
        "tree_s": tree_s, "tree_model_s": tree_model, "tree_err": tree_s / tree_model - 1,
        "ring_s": ring_s, "ring_model_s": ring_model, "ring_err": ring_s / ring_model - 1,
        "tree_speedup": ring_s / tree_s, "packing_rate_mbs": packing.rate / MB,
        "bound_mbs": packing.upper_bound / MB,
    }  # fmt: skip


def run(quick: bool, mbytes: float = 8.0, chunk_elements: int = 1 << 18) -> list[dict[str, Any]]:
    nbytes = int(mbytes * MB) // 4 * 4
    results = [asyncio.run(run_case(name, cap, nbytes, chunk_elements)) for name, cap in topologies(quick)]
    print(f"\n{'topology':30s} {'trees':>5s} {'tree s':>7s} {'model':>7s} {'err':>6s} "
          f"{'ring s':>7s} {'model':>7s} {'err':>6s} {'tree/ring':>9s}")  # fmt: skip
    for r in results:
        print(f"{r['topology']:30s} {r['trees']:5d} {r['tree_s']:7.2f} {r['tree_model_s']:7.2f} "
              f"{r['tree_err']:+6.0%} {r['ring_s']:7.2f} {r['ring_model_s']:7.2f} {r['ring_err']:+6.0%} "
              f"{r['tree_speedup']:8.2f}x")  # fmt: skip
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mbytes", type=float, default=8.0, help="all-reduce size, MiB of fp32")
    ap.add_argument("--chunk", type=int, default=1 << 18, help="elements per pipeline step, all trees")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "bench_executor.json")
    args = ap.parse_args()
    results = run(args.quick, args.mbytes, args.chunk)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
