"""Independent checks of a packing: spanning trees, loads within capacities."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import networkx as nx
import numpy as np

from potluck.coordinator.trees import Packing


def assert_valid_allreduce(p: Packing, cap: np.ndarray, node_cap: Sequence[float] | None = None) -> None:
    n = len(p.nodes)
    index = {u: i for i, u in enumerate(p.nodes)}
    load = np.zeros((n, n))
    peer = np.zeros(n)
    for w, edges in p.trees:
        assert w > 0
        g = nx.Graph()
        g.add_nodes_from(p.nodes)
        g.add_edges_from(edges)
        assert len(edges) == n - 1 and nx.is_connected(g), "not a spanning tree"
        for u, v in edges:
            a, b = index[u], index[v]
            load[a, b] += w
            load[b, a] += w
            peer[a] += w
            peer[b] += w
    assert np.all(load <= cap * (1 + 1e-6) + 1e-9), "a link direction is over capacity"
    if node_cap is not None:
        assert np.all(peer <= np.asarray(node_cap) * (1 + 1e-6) + 1e-9), "a peer cap is exceeded"
    assert abs(sum(w for w, _ in p.trees) - p.rate) <= 1e-9 * p.rate


def assert_valid_broadcast(p: Packing, cap: np.ndarray, root: Hashable) -> None:
    n = len(p.nodes)
    load = np.zeros((n, n))
    for w, arcs in p.trees:
        g = nx.DiGraph(arcs)
        assert len(arcs) == n - 1 and nx.is_arborescence(g) and g.in_degree(root) == 0
        for u, v in arcs:
            load[u, v] += w
    assert np.all(load <= cap * (1 + 1e-6) + 1e-9)
