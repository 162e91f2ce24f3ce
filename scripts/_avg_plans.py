"""What scripts/bench_vs_hivemind.py compares over one topology: the shaped caps (``Topology``,
``make_topologies``, ``capacities``) and each system's plan on them (``Plans``, ``make_plans``: potluck's
trees and ring, hivemind's butterfly shares), with the time model's prediction for each."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

GOODPUT = 1448 / 1514  # TCP payload per 1500-byte-MTU Ethernet frame (timestamps on)
HM_PART_BYTES = 1 << 19  # hivemind's DEFAULT_PART_SIZE_BYTES


@dataclass
class Topology:
    name: str
    up: list[float | None]  # Mbit/s per peer (None: unshaped)
    down: list[float | None] | None = None
    pair: dict[tuple[int, int], float] = field(default_factory=dict)  # Mbit/s caps on single pairs
    note: str = ""

    @property
    def shaped(self) -> bool:
        return any(u is not None for u in self.up) or bool(self.pair)


def make_topologies(n: int, args: argparse.Namespace) -> list[Topology]:
    out = [Topology("unshaped (CPU floor)", [None] * n, note="no qdisc")]
    out.append(Topology(f"uniform {args.uniform:g}", [args.uniform] * n))
    for seed in args.seeds:
        rng = np.random.default_rng(seed * 100 + n)
        caps = np.clip(rng.lognormal(math.log(args.median), args.sigma, size=n), args.min_cap, args.max_cap)
        fast = 1 if n <= 4 else 2
        caps[:fast] = args.fast
        out.append(Topology(f"random seed {seed}", [round(float(c), 1) for c in caps]))
    if args.two_site and n >= 4:
        half = n // 2
        pair = {(i, j): args.cross for i in range(n) for j in range(n) if (i < half) != (j < half)}
        out.append(
            Topology(
                f"two sites {args.two_site_up:g}/{args.cross:g}",
                [args.two_site_up] * n,
                pair=pair,
                note=f"{half}+{n - half} peers; cross-site pairs {args.cross:g} Mbit/s",
            )
        )
    if args.down_factor:
        for t in out:
            t.down = [None if u is None else u * args.down_factor for u in t.up]
    return out


def capacities(topo: Topology, n: int) -> tuple[np.ndarray, list[float]]:
    """Link matrix (bytes/s, goodput) min(up_u, down_v, pair_uv) and per-peer caps min(up, down)."""
    unshaped = 10_000.0  # Mbit/s stand-in for "no qdisc" (only the plan's shape matters there)

    def bps(mbit: float | None) -> float:
        return (unshaped if mbit is None else mbit) * 1e6 / 8 * GOODPUT

    up = [bps(u) for u in topo.up]
    down = [bps(None if topo.down is None else topo.down[i]) for i in range(n)]
    cap = np.zeros((n, n))
    for u in range(n):
        for v in range(n):
            if u != v:
                cap[u, v] = min(up[u], down[v], bps(topo.pair[(u, v)]) if (u, v) in topo.pair else math.inf)
    return cap, [min(a, b) for a, b in zip(up, down, strict=True)]


@dataclass
class Plans:
    schedule: dict[str, Any]  # JSON form of the AllReduceSchedule, peer indices as strings
    ring: list[int]
    trees: int
    tree_model_s: float
    ring_model_s: float
    hm_model_s: float
    hm_bandwidth: list[float] | None
    rate_mbit: float
    bound_mbit: float


def make_plans(topo: Topology, n: int, nbytes: int, chunk_elements: int) -> Plans:
    from hivemind.averaging.load_balancing import load_balance_peers

    from potluck.coordinator.trees import pack_allreduce, pack_rings
    from potluck.coordinator.trees.plan import (
        choose_tree_plan,
        predict_allreduce_time,
        ring_plan,
        tree_plan,
    )

    cap, node = capacities(topo, n)
    nodes = list(range(n))
    packing = pack_allreduce(cap, node_capacity=node)  # for its rate and certified bound
    # What potluck runs: the packed trees or the one-hop stars, whichever the time model says is faster.
    tplan = choose_tree_plan(nodes, cap, nbytes, chunk_bytes=chunk_elements * 4, node_capacity=node)
    rings = pack_rings(cap, node_capacity=node)
    weight, order = max(rings.rings, key=lambda r: r[0])
    rplan = ring_plan(nodes, [(weight, order)])
    # hivemind is told the same per-peer caps (its `bandwidth`), in Mbit/s; None = equal shares
    hm_bw = None if not topo.shaped else [c * 8 / 1e6 / GOODPUT for c in node]
    sizes = load_balance_peers(nbytes // 4, hm_bw if hm_bw is not None else [None] * n)
    stars = [(float(s), [(c, v) for v in nodes if v != c]) for c, s in enumerate(sizes) if s > 0]
    hplan = tree_plan(nodes, stars)
    chunk = chunk_elements * 4
    return Plans(
        schedule={
            "peers": [str(i) for i in nodes],
            "trees": [
                {
                    "root": str(t.root),
                    "share": t.share,
                    "parent": {str(c): (None if p is None else str(p)) for c, p in t.parent.items()},
                }
                for t in tplan.trees
            ],
        },
        ring=[int(str(v)) for v in order],
        trees=len(tplan.trees),
        tree_model_s=predict_allreduce_time(tplan, nbytes, cap, chunk_bytes=chunk, node_capacity=node),
        ring_model_s=predict_allreduce_time(rplan, nbytes, cap, chunk_bytes=chunk, node_capacity=node),
        hm_model_s=predict_allreduce_time(hplan, nbytes, cap, chunk_bytes=HM_PART_BYTES, node_capacity=node),
        hm_bandwidth=hm_bw,
        rate_mbit=packing.rate * 8 / 1e6,
        bound_mbit=packing.upper_bound * 8 / 1e6,
    )
