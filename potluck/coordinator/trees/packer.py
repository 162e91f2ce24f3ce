"""pack_allreduce and pack_broadcast: weighted spanning trees that maximise collective throughput.

Model (see docs/collectives.md). All-reduce over a tree T reduces leaf -> root and broadcasts back, so a
tree edge {u, v} carrying weight w_T uses w_T in *each* direction: the edge's usable capacity is
min(c[u][v], c[v][u]). A peer's optional cap is shared by all its tree edges: sum_T w_T deg_T(u) <= cap(u)
(the same accounting as hivemind's butterfly: a star root carries N-1 edges). The rate R = sum_T w_T;
an all-reduce of D bytes gives tree T the share D * w_T / R and takes about D / R plus pipeline fill.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

from potluck.coordinator.trees import bounds, core
from potluck.coordinator.trees.graph import (
    CapacityInput,
    Network,
    NodeCapacityInput,
    PackingError,
    make_network,
    require_spanning,
)
from potluck.coordinator.trees.oracles import ArborescenceResources, TreeResources

logger = logging.getLogger(__name__)

Edge = tuple[Hashable, Hashable]
WeightedTree = tuple[float, list[Edge]]


@dataclass(frozen=True)
class Certificate:
    """Upper bounds on the rate; upper_bound is the smallest one valid for the collective packed.

    dual_bound is LP duality over the class of trees searched: all spanning trees (then it bounds every
    tree plan) or only stars when one_hop=True (then it bounds one-hop plans only and is left out of
    upper_bound). partition is the peer partition attaining partition_bound.
    """

    upper_bound: float
    dual_bound: float
    partition_bound: float
    partition: tuple[tuple[Hashable, ...], ...]
    partition_exact: bool
    broadcast_bound: float
    node_bound: float


@dataclass(frozen=True)
class PackingStats:
    """How the packing was reached (deterministic counts, no timings)."""

    mwu_iterations: int
    mwu_rate: float
    mwu_trees: int
    lp_rate: float
    lp_trees: int
    lp_columns: int
    colgen_rounds: int


@dataclass(frozen=True)
class Packing:
    """Weighted trees, heaviest first. Edges are (u, v) pairs of the caller's peer labels; for a
    broadcast packing they are (parent, child) arcs away from the root."""

    nodes: tuple[Hashable, ...]
    trees: list[WeightedTree]
    rate: float
    upper_bound: float
    certificate: Certificate
    collective: str
    one_hop: bool
    stats: PackingStats

    @property
    def efficiency(self) -> float:
        """rate / upper_bound (1.0 = provably optimal)."""
        return self.rate / self.upper_bound if self.upper_bound > 0 else 0.0


def _scale(net: Network) -> float:
    """Unit for the LP: the least per-peer throughput (own cap or sum of its two-way links).

    It bounds the rate from above (every tree touches every peer), so normalised rates are <= 1 and
    well above HiGHS's absolute tolerances (~1e-7) unless a group spans > 1e6 in bandwidth.
    """
    per_peer = np.minimum(net.sym().sum(axis=1), np.minimum(net.up, net.down))
    return float(per_peer.min())


# Default MWU budget: MWU only seeds the LP with good columns; column generation closes the gap.
_MWU_ITERATIONS_PER_PEER = 4
# Default column-generation rounds: each is one LP (~0.15 s at N = 64). Small groups (DGX-1 subsets)
# converge in a few rounds; large ones stop here and rely on greedy trees and the partition bound.
_COLGEN_ROUNDS = 24


# Column generation stops once the LP is within tolerance * this of a bound: closer is wasted work,
# since the few-trees step gives up `tolerance` anyway.
_COLGEN_GAP_PER_TOLERANCE = 0.2


def _run(
    oracle: core.Oracle,
    n_resources: int,
    *,
    n: int,
    eps: float,
    max_iterations: int | None,
    colgen_rounds: int | None,
    tolerance: float,
    max_trees: int | None,
    extra_bound: Callable[[np.ndarray], float] | None = None,
) -> tuple[core.Solution, core.Solution, PackingStats]:
    iterations = max_iterations if max_iterations is not None else _MWU_ITERATIONS_PER_PEER * n
    count = max_trees if max_trees is not None else 2 * n
    widest = core.greedy(oracle, n_resources, count=count)
    raw = core.mwu(oracle, n_resources, eps=eps, max_iterations=iterations)
    lp = core.colgen(
        oracle,
        raw,
        max_rounds=colgen_rounds if colgen_rounds is not None else _COLGEN_ROUNDS,
        gap=_COLGEN_GAP_PER_TOLERANCE * tolerance,
        seeds=widest,
        extra_bound=extra_bound,
    )
    few = core.fewest(lp, tol=tolerance, max_count=count, extra=widest, oracle=oracle)
    stats = PackingStats(
        mwu_iterations=raw.iterations,
        mwu_rate=raw.value,
        mwu_trees=len(raw.columns),
        lp_rate=lp.value,
        lp_trees=int((lp.weights > 1e-12 * lp.value).sum()),
        lp_columns=len(lp.columns),
        colgen_rounds=lp.iterations - raw.iterations,
    )
    return few, lp, stats


def _partition(net: Network, labels: np.ndarray) -> tuple[tuple[Hashable, ...], ...]:
    groups: dict[int, list[Hashable]] = {}
    for i, lab in enumerate(labels.tolist()):
        groups.setdefault(int(lab), []).append(net.nodes[i])
    return tuple(tuple(g) for g in groups.values())


def pack_allreduce(
    capacity: CapacityInput,
    *,
    node_capacity: NodeCapacityInput | None = None,
    max_trees: int | None = None,
    one_hop: bool = False,
    eps: float = 0.1,
    max_iterations: int | None = None,
    colgen_rounds: int | None = None,
    tolerance: float = 0.005,
    certify_broadcast: bool = True,
) -> Packing:
    """Weighted spanning trees for all-reduce over measured links (and optional per-peer caps).

    capacity[u][v] is the measured rate u -> v (0 = no direct link); node_capacity[u] a rate or an
    (upload, download) pair shared by all of u's tree edges. one_hop=True restricts the trees to stars
    (hivemind's butterfly all-reduce, with LP-optimal shares). max_trees (default 2N) caps the tree
    count; tolerance is the fraction of the LP optimum given up to use fewer trees. Pure and
    deterministic. Raises PackingError when the group has < 2 peers or no two-way spanning tree.
    """
    net = make_network(capacity, node_capacity)
    require_spanning(net, sym=True)
    scale = _scale(net)
    edges, edge_cap = net.undirected_edges()
    res = TreeResources(net.n, edges, edge_cap / scale, net.node_tree_cap() / scale)
    if one_hop and len(res.star_centers()) == 0:
        raise PackingError("no peer has a two-way link to every other peer: no one-hop (star) tree exists")
    oracle = res.star_oracle if one_hop else res.mst_oracle

    def partition_bound(prices: np.ndarray) -> float:  # in LP units
        return bounds.level_set_bound(net, res.edge_costs(prices))[0] / scale

    sol, lp, stats = _run(
        oracle,
        res.n_resources,
        n=net.n,
        eps=eps,
        max_iterations=max_iterations,
        colgen_rounds=colgen_rounds,
        tolerance=tolerance,
        max_trees=max_trees,
        extra_bound=partition_bound,
    )
    rate = sol.value * scale
    if net.n <= bounds.MAX_ENUMERATED:
        part_value, labels = bounds.exact_strength(net)
        exact = True
    else:
        part_value, labels = bounds.level_set_bound(net, res.edge_costs(lp.prices))
        exact = False
    dual = sol.dual_bound * scale
    bcast = bounds.min_broadcast_bound(net.cap) if certify_broadcast else math.inf
    nodeb = bounds.node_bound(net)
    upper = min(part_value, bcast, nodeb, math.inf if one_hop else dual)
    cert = Certificate(
        upper_bound=upper,
        dual_bound=dual,
        partition_bound=part_value,
        partition=_partition(net, labels),
        partition_exact=exact,
        broadcast_bound=bcast,
        node_bound=nodeb,
    )
    trees = [
        (float(w) * scale, [(net.nodes[int(edges[e, 0])], net.nodes[int(edges[e, 1])]) for e in col.key])
        for w, col in sorted(zip(sol.weights, sol.columns, strict=True), key=lambda t: -t[0])
    ]
    if rate > upper * (1 + 1e-6):
        logger.warning("packing rate %.6g exceeds its certificate %.6g: numerical trouble", rate, upper)
    return Packing(
        nodes=net.nodes,
        trees=trees,
        rate=rate,
        upper_bound=upper,
        certificate=cert,
        collective="allreduce",
        one_hop=one_hop,
        stats=_rescaled(stats, scale),
    )


def _rescaled(stats: PackingStats, scale: float) -> PackingStats:
    return PackingStats(
        mwu_iterations=stats.mwu_iterations,
        mwu_rate=stats.mwu_rate * scale,
        mwu_trees=stats.mwu_trees,
        lp_rate=stats.lp_rate * scale,
        lp_trees=stats.lp_trees,
        lp_columns=stats.lp_columns,
        colgen_rounds=stats.colgen_rounds,
    )


def pack_broadcast(
    capacity: CapacityInput,
    root: Hashable,
    *,
    node_capacity: NodeCapacityInput | None = None,
    max_trees: int | None = None,
    eps: float = 0.1,
    max_iterations: int | None = None,
    colgen_rounds: int | None = None,
    tolerance: float = 0.005,
) -> Packing:
    """Weighted arborescences rooted at root for a broadcast over directed links (Blink's packing).

    Per-peer caps bound uploads by out-degree and downloads by in-degree. upper_bound is Edmonds'
    lambda(root) (networkx max-flow) tightened by LP duality.
    """
    net = make_network(capacity, node_capacity)
    if root not in net.nodes:
        raise PackingError(f"root {root!r} is not a peer of this group")
    r = net.nodes.index(root)
    if net.n < 2:
        raise PackingError(f"a collective needs at least 2 peers, got {net.n}")
    bcast = bounds.broadcast_bound(net.cap, r)
    if bcast <= 0:
        raise PackingError(f"some peer cannot be reached from root {root!r}: no spanning arborescence")
    scale = _scale(net)
    res = ArborescenceResources(net.cap / scale, net.up / scale, net.down / scale, r)
    sol, _, stats = _run(
        res.oracle,
        res.n_resources,
        n=net.n,
        eps=eps,
        max_iterations=max_iterations,
        colgen_rounds=colgen_rounds,
        tolerance=tolerance,
        max_trees=max_trees,
    )
    dual = sol.dual_bound * scale
    upper = min(bcast, dual)
    cert = Certificate(
        upper_bound=upper,
        dual_bound=dual,
        partition_bound=math.inf,
        partition=(),
        partition_exact=False,
        broadcast_bound=bcast,
        node_bound=math.inf,
    )
    trees = [
        (
            float(w) * scale,
            [(net.nodes[int(res.arcs[a, 0])], net.nodes[int(res.arcs[a, 1])]) for a in col.key],
        )
        for w, col in sorted(zip(sol.weights, sol.columns, strict=True), key=lambda t: -t[0])
    ]
    return Packing(
        nodes=net.nodes,
        trees=trees,
        rate=sol.value * scale,
        upper_bound=upper,
        certificate=cert,
        collective="broadcast",
        one_hop=False,
        stats=_rescaled(stats, scale),
    )
