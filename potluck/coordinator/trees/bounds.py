"""Upper bounds (certificates) on the rate of tree all-reduce and broadcast.

- Edmonds (1973): the fractional number of arborescences rooted at r that fit in a digraph equals
  lambda(r) = min over v != r of the r -> v max-flow. The minimum over all roots bounds any broadcast,
  and also the tree all-reduce (every cut of the two-way graph is a cut of the digraph).
- Nash-Williams / Tutte: the fractional spanning-tree packing number of an undirected graph equals its
  strength, min over partitions P (|P| >= 2) of c(delta(P)) / (|P| - 1). Any one partition gives an
  upper bound. ``exact_strength`` enumerates all partitions (Bell(9) = 21,147 for N = 9);
  ``level_set_bound`` tries only the partitions cut out by thresholds on a price vector, which is exact
  when the prices are optimal LP duals of the link-capacitated packing.
- Per-peer caps: every spanning tree gives each peer degree >= 1 and has 2(N-1) edge ends.
"""

from __future__ import annotations

import functools
import math

import networkx as nx
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_flow

from potluck.coordinator.trees.graph import Network

# Largest group whose partitions exact_strength enumerates (Bell(10) = 115,975 is still fine but slow).
MAX_ENUMERATED = 9


@functools.lru_cache(maxsize=MAX_ENUMERATED + 1)
def set_partitions(n: int) -> np.ndarray:
    """All partitions of n labelled items as restricted-growth label rows (Bell(n) x n, int8)."""
    labels = np.zeros((1, 1), dtype=np.int8)
    for _ in range(1, n):
        top = labels.max(axis=1)
        rows = [
            np.column_stack([labels[top + 1 >= k], np.full((int((top + 1 >= k).sum()), 1), k)])
            for k in range(int(top.max()) + 2)
        ]
        labels = np.vstack(rows).astype(np.int8)
    labels.setflags(write=False)
    return labels


def partition_value(edges: np.ndarray, edge_cap: np.ndarray, labels: np.ndarray) -> float:
    """c(delta(P)) / (|P| - 1) for one partition given as a label per node (inf for one part)."""
    parts = len(np.unique(labels))
    if parts < 2:
        return math.inf
    crossing = labels[edges[:, 0]] != labels[edges[:, 1]]
    return float(edge_cap[crossing].sum()) / (parts - 1)


def exact_strength(net: Network) -> tuple[float, np.ndarray]:
    """The exact partition bound (= the optimal fractional tree packing without peer caps), N <= 9."""
    if net.n > MAX_ENUMERATED:
        raise ValueError(f"exact_strength enumerates partitions; N = {net.n} > {MAX_ENUMERATED}")
    edges, cap = net.undirected_edges()
    labels = set_partitions(net.n)[1:]  # row 0 is the single-part partition
    crossing = labels[:, edges[:, 0]] != labels[:, edges[:, 1]]
    values = (crossing @ cap) / (labels.max(axis=1).astype(np.float64))
    best = int(np.argmin(values))
    return float(values[best]), labels[best].astype(np.int64)


def level_set_bound(net: Network, edge_price: np.ndarray) -> tuple[float, np.ndarray]:
    """Best partition bound among the components of {e : price_e < t} over all thresholds t > 0.

    Kruskal order: edges by increasing price join components; the partition only changes at a merge
    (at most N - 1 times), so only those thresholds are evaluated.
    """
    edges, cap = net.undirected_edges()
    root = list(range(net.n))

    def find(u: int) -> int:
        while root[u] != u:
            root[u] = root[root[u]]
            u = root[u]
        return u

    best_labels = np.arange(net.n)
    best = partition_value(edges, cap, best_labels)  # all singletons: always a valid partition
    order = np.argsort(edge_price, kind="stable")
    prices = edge_price[order]
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and prices[j] == prices[i]:
            j += 1
        group = [(int(edges[k, 0]), int(edges[k, 1])) for k in order[i:j]]
        if prices[i] > 0 and any(find(u) != find(v) for u, v in group):
            labels = np.array([find(u) for u in range(net.n)])
            value = partition_value(edges, cap, labels)
            if value < best:
                best, best_labels = value, labels
        for u, v in group:
            root[find(u)] = find(v)
        i = j
    return best, best_labels.astype(np.int64)


def _flow_graph(cap: np.ndarray) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(range(cap.shape[0]))
    src, dst = np.nonzero(cap > 0)
    graph.add_weighted_edges_from(
        zip(src.tolist(), dst.tolist(), cap[src, dst].tolist(), strict=True), weight="capacity"
    )
    return graph


def broadcast_bound(cap: np.ndarray, root: int) -> float:
    """Edmonds' lambda(root): the best fractional broadcast rate from root (networkx max-flow)."""
    graph = _flow_graph(cap)
    return min(float(nx.maximum_flow_value(graph, root, v)) for v in range(cap.shape[0]) if v != root)


# Integer scale for scipy's max-flow: the largest capacity becomes 2**20 units, so a cut of up to
# 2**10 links still fits its 32-bit flows.
_FLOW_UNITS = 2**20


def min_broadcast_bound(cap: np.ndarray) -> float:
    """min over roots of lambda(root): the global directed min cut (2(N-1) max-flows through node 0).

    Uses scipy's compiled max-flow (networkx's takes ~1 s at N = 64) on capacities rounded *up* to
    integer units, so the result stays a valid upper bound (loose by at most N / 2**20 relative).
    """
    unit = float(cap.max()) / _FLOW_UNITS
    graph = csr_matrix(np.ceil(cap / unit).astype(np.int32))
    flows = [
        min(maximum_flow(graph, 0, v).flow_value, maximum_flow(graph, v, 0).flow_value)
        for v in range(1, cap.shape[0])
    ]
    return min(flows) * unit


def node_bound(net: Network) -> float:
    """Bound from per-peer caps alone: each tree loads every peer with degree >= 1, 2(N-1) ends in all."""
    caps = net.node_tree_cap()
    if not np.isfinite(caps).any():
        return math.inf
    total = float(caps.sum()) / (2 * (net.n - 1)) if np.isfinite(caps).all() else math.inf
    return min(float(caps.min()), total)
