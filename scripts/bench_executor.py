#!/usr/bin/env python3
"""All-reduce executor on shaped links: measured time vs the planner's model, and tree vs ring.

Peers are real p2pd daemons on 127.0.0.1 in one process; an in-process shaper paces every send to the
link and per-peer rates of the topology (potluck.testbed.shaping), so measured times can be compared with
potluck.coordinator.trees.plan.predict_allreduce_time on the same capacities.

All peers share this process's event loop, so every message's handling (encode, framing, the mailbox,
decode) queues on one loop: each case first measures that cost on its own daemons (two message sizes
streamed between two mailboxes) and passes it to the model with ``shared_loop=True``. The model without
message costs (bandwidth, fill, latency only) is reported next to it.

    python scripts/bench_executor.py [--mbytes 8] [--chunk 262144] [--repeats 2] [--skip-rings] [--quick]
        [--message-s S --message-byte-s S] [--out bench-out/bench_executor.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from potluck.compression import get_codec  # noqa: E402
from potluck.coordinator.trees import pack_allreduce  # noqa: E402
from potluck.coordinator.trees.plan import (  # noqa: E402
    RingPlan,
    TreePlan,
    predict_allreduce_time,
    ring_plan,
    tree_plan,
)
from potluck.coordinator.trees.rings import pack_rings  # noqa: E402
from potluck.net.config import TransportConfig  # noqa: E402
from potluck.net.mailbox import Mailbox  # noqa: E402
from potluck.net.tags import Stream, make_tag  # noqa: E402
from potluck.peer.collectives.tree import ring_allreduce, tree_allreduce  # noqa: E402
from potluck.peer.config import AllReduceConfig  # noqa: E402
from potluck.protocol.collective import AllReduceSchedule, TreeSpec  # noqa: E402
from potluck.testbed.harness.p2p import p2p_group  # noqa: E402
from potluck.testbed.shaping import LinkShaper  # noqa: E402
from potluck.testbed.topologies import lognormal_graph  # noqa: E402

MB = 1 << 20
KB = 1 << 10
# Message sizes (bytes) the handling cost is fitted between: they bracket the executor's messages here
# (share_T * chunk: 6-120 KiB at the default chunk, 1-8 KiB at 8 k elements per step).
COST_SIZES = (4 * KB, 128 * KB)


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


async def stream_s(src: Mailbox, dst: Mailbox, nbytes: int, count: int, round_no: int) -> float:
    """Wall seconds per message for ``count`` messages of ``nbytes`` streamed src -> dst, the sender
    encoding and the receiver decoding (codec "none", accumulating) as the executor does."""
    codec = get_codec("none")
    x = torch.randn(nbytes // 4)
    acc = torch.zeros_like(x)

    async def send() -> None:
        for i in range(count):
            tag = make_tag(round_no, Stream.DATA, chunk=i)
            await src.send(dst.peer_id, tag, codec.encode(x, key=(round_no, 0, i)))

    async def recv() -> None:
        for i in range(count):
            tag = make_tag(round_no, Stream.DATA, chunk=i)
            codec.decode_into(await dst.recv(src.peer_id, tag), acc, accumulate=True)

    start = time.perf_counter()
    await asyncio.gather(send(), recv())
    return (time.perf_counter() - start) / count


async def measure_message_cost(p2ps: list[Any], repeats: int = 5) -> tuple[float, float]:
    """(message_s, message_byte_s): this loop's seconds per message end, fixed and per byte.

    Streams messages between the first two daemons of the group on a protocol of their own, through a
    LinkShaper with unbounded rates (so its clock and timer run, as in the executor, but never wait).
    Both ends run on this loop, so a message's wall time is two handlings; the two sizes give the fixed
    and per-byte parts. Sizes alternate and each keeps its best of ``repeats``: the runs least disturbed
    by other load on the machine (the model predicts an undisturbed run).
    """
    ids = [p.peer_id.to_base58() for p in p2ps[:2]]
    shaper = LinkShaper({(ids[0], ids[1]): 1e15})  # bytes/s: pacing computes, sleeps ~0
    src, dst = (
        Mailbox(p, "potluck/bench/message-cost/1", TransportConfig(timeout_s=60), shaper) for p in p2ps[:2]
    )
    await src.start()
    await dst.start()
    small, large = COST_SIZES
    await stream_s(src, dst, small, 50, 0)  # warm-up: the stream opened, buffers allocated
    best = {small: math.inf, large: math.inf}
    for r in range(repeats):
        for i, (size, count) in enumerate(((small, 400), (large, 100))):
            best[size] = min(best[size], await stream_s(src, dst, size, count, 1 + 2 * r + i))
    await src.close()
    await dst.close()
    byte_s = max(0.0, (best[large] - best[small]) / (large - small)) / 2  # two ends per message
    return max(0.0, best[small] / 2 - byte_s * small), byte_s


async def run_case(
    name: str,
    cap: np.ndarray,
    nbytes: int,
    chunk_elements: int,
    repeats: int,
    skip_rings: bool,
    cost: tuple[float, float] | None,
) -> dict[str, Any]:
    n = cap.shape[0]
    nodes = list(range(n))
    packing = pack_allreduce(cap)
    tplan = tree_plan(nodes, packing.trees)
    rings = pack_rings(cap)
    weight, order = max(rings.rings, key=lambda r: r[0])
    rplan = ring_plan(nodes, [(weight, order)])
    chunk_bytes = chunk_elements * 4
    load_before = os.getloadavg()[0]
    async with p2p_group(n) as p2ps:
        ids = [p.peer_id.to_base58() for p in p2ps]
        rates = {(ids[u], ids[v]): float(cap[u, v]) for u in nodes for v in nodes if cap[u, v] > 0}
        shaper = LinkShaper(rates)
        tcfg = TransportConfig(timeout_s=120)
        boxes = [Mailbox(p, "potluck/bench/allreduce/1", tcfg, shaper) for p in p2ps]
        for box in boxes:
            await box.start()
        peer: dict[Hashable, str] = dict(zip(nodes, ids, strict=True))  # plan label -> peer id
        schedule = AllReduceSchedule(
            tuple(ids),
            tuple(
                TreeSpec(
                    peer[t.root],
                    {peer[c]: peer[p] if p is not None else None for c, p in t.parent.items()},
                    t.share,
                )
                for t in tplan.trees
            ),
        )
        ring_order = tuple(peer[i] for i in order)
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

        message_s, message_byte_s = cost if cost is not None else await measure_message_cost(p2ps)
        await timed(tree, 0)  # warm-up: streams opened, allocations made
        tree_s = min([await timed(tree, 1 + r) for r in range(repeats)])
        ring_s = math.nan
        if not skip_rings:
            await timed(ring, 1000)
            ring_s = min([await timed(ring, 1001 + r) for r in range(repeats)])
        for box in boxes:
            await box.close()

    def model(plan: TreePlan | RingPlan, costed: bool) -> float:
        if not costed:  # bandwidth, fill and latency only: the model before message costs
            return predict_allreduce_time(plan, nbytes, cap, chunk_bytes=chunk_bytes)
        return predict_allreduce_time(
            plan,
            nbytes,
            cap,
            chunk_bytes=chunk_bytes,
            message_s=message_s,
            message_byte_s=message_byte_s,
            shared_loop=True,  # one loop: this process
        )

    tree_model, tree_bw = model(tplan, True), model(tplan, False)
    ring_model, ring_bw = model(rplan, True), model(rplan, False)
    out: dict[str, Any] = {
        "topology": name,
        "peers": n,
        "mbytes": nbytes / MB,
        "trees": len(tplan.trees),
        "chunk_elements": chunk_elements,
        "repeats": repeats,
        "message_us": message_s * 1e6,
        "message_ns_per_byte": message_byte_s * 1e9,
        "tree_s": tree_s,
        "tree_model_s": tree_model,
        "tree_err": tree_s / tree_model - 1,
        "tree_bw_model_s": tree_bw,
        "tree_bw_err": tree_s / tree_bw - 1,
        "ring_s": ring_s,
        "ring_model_s": ring_model,
        "ring_err": ring_s / ring_model - 1,
        "ring_bw_model_s": ring_bw,
        "ring_bw_err": ring_s / ring_bw - 1,
        "tree_speedup": ring_s / tree_s,
        "packing_rate_mbs": packing.rate / MB,
        "bound_mbs": packing.upper_bound / MB,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }
    if skip_rings:  # JSON has no NaN: rings not run are null
        out.update({k: None for k in out if k.startswith("ring_") or k == "tree_speedup"})
    return out


def run(
    quick: bool,
    mbytes: float = 8.0,
    chunk_elements: int = 1 << 18,
    repeats: int = 2,
    skip_rings: bool = False,
    cost: tuple[float, float] | None = None,
) -> list[dict[str, Any]]:
    nbytes = int(mbytes * MB) // 4 * 4
    results = [
        asyncio.run(run_case(name, cap, nbytes, chunk_elements, repeats, skip_rings, cost))
        for name, cap in topologies(quick)
    ]
    print(
        f"\n{'topology':30s} {'trees':>5s} {'msg us':>6s} {'ns/B':>5s} {'tree s':>7s} {'model':>7s} "
        f"{'err':>6s} {'bw-only':>7s} {'err':>6s} {'ring s':>7s} {'model':>7s} {'err':>6s} "
        f"{'tree/ring':>9s} {'load':>9s}"
    )
    for r in results:
        ring = (
            f"{r['ring_s']:7.2f} {r['ring_model_s']:7.2f} {r['ring_err']:+6.0%} {r['tree_speedup']:8.2f}x"
            if r["ring_s"] is not None
            else f"{'-':>7s} {'-':>7s} {'-':>6s} {'-':>9s}"
        )
        print(
            f"{r['topology']:30s} {r['trees']:5d} {r['message_us']:6.0f} {r['message_ns_per_byte']:5.2f} "
            f"{r['tree_s']:7.2f} {r['tree_model_s']:7.2f} {r['tree_err']:+6.0%} "
            f"{r['tree_bw_model_s']:7.2f} {r['tree_bw_err']:+6.0%} {ring} "
            f"{r['load_before']:4.1f}/{r['load_after']:4.1f}"
        )
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mbytes", type=float, default=8.0, help="all-reduce size, MiB of fp32")
    ap.add_argument("--chunk", type=int, default=1 << 18, help="elements per pipeline step, all trees")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per executor after a warm-up (best)")
    ap.add_argument("--skip-rings", action="store_true", help="trees only (rings do not depend on --chunk)")
    ap.add_argument("--message-s", type=float, help="fixed handling per message end, s (default: measured)")
    ap.add_argument("--message-byte-s", type=float, help="handling per byte per message end, s")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "bench_executor.json")
    args = ap.parse_args()
    if (args.message_s is None) != (args.message_byte_s is None):
        ap.error("give both --message-s and --message-byte-s, or neither (measure them)")
    cost = None if args.message_s is None else (args.message_s, args.message_byte_s)
    results = run(args.quick, args.mbytes, args.chunk, args.repeats, args.skip_rings, cost)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
