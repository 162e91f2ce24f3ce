"""Cheapest-structure oracles under resource prices, and the usage vectors of the structures.

Resources are laid out as: one per capacitated link (undirected edge for trees, arc for arborescences
and rings), then one per capped peer row (a tree's peer row counts weight x degree). Prices arrive in
the same layout. A structure's price is additive over its edges, so each oracle is a classic
combinatorial problem on per-edge costs: minimum spanning tree (all-reduce trees), cheapest star
(one-hop / butterfly trees), minimum arborescence (broadcast).
"""

from __future__ import annotations

import networkx as nx
import numpy as np
from scipy.sparse.csgraph import minimum_spanning_tree

from potluck.coordinator.trees.core import Column


class TreeResources:
    """Resource layout for undirected spanning trees: E edge rows, then one row per capped peer."""

    def __init__(self, n: int, edges: np.ndarray, edge_cap: np.ndarray, node_cap: np.ndarray) -> None:
        self.n = n
        self.edges = edges
        self.edge_cap = edge_cap
        self.capped = np.flatnonzero(np.isfinite(node_cap))
        self.node_cap = node_cap[self.capped]
        self.n_resources = len(edges) + len(self.capped)
        self.edge_index = np.full((n, n), -1, dtype=np.int64)
        ids = np.arange(len(edges))
        self.edge_index[edges[:, 0], edges[:, 1]] = ids
        self.edge_index[edges[:, 1], edges[:, 0]] = ids

    def usage(self, edge_ids: np.ndarray) -> np.ndarray:
        use = np.zeros(self.n_resources)
        use[edge_ids] = 1.0 / self.edge_cap[edge_ids]
        if len(self.capped):
            deg = np.bincount(self.edges[edge_ids].ravel(), minlength=self.n)
            use[len(self.edges) :] = deg[self.capped] / self.node_cap
        return use

    def column(self, edge_ids: np.ndarray) -> Column:
        ids = np.sort(edge_ids)
        return Column(key=tuple(int(i) for i in ids), usage=self.usage(ids))

    def edge_costs(self, prices: np.ndarray) -> np.ndarray:
        """Cost of each edge: its link price plus both endpoints' peer prices (degree counts once each)."""
        cost = prices[: len(self.edges)] / self.edge_cap
        if len(self.capped):
            per_node = np.zeros(self.n)
            per_node[self.capped] = prices[len(self.edges) :] / self.node_cap
            cost = cost + per_node[self.edges[:, 0]] + per_node[self.edges[:, 1]]
        return cost

    def mst_oracle(self, prices: np.ndarray) -> Column:
        # A minimum spanning tree depends only on the order of the costs. scipy reads zeros (and values
        # below ~1e-8) as "no edge", and LP duals are often exactly 0, so it gets ranks 1..E instead
        # (ties broken by edge index: deterministic).
        rank = np.empty(len(self.edges))
        rank[np.argsort(self.edge_costs(prices), kind="stable")] = np.arange(1, len(self.edges) + 1)
        dense = np.zeros((self.n, self.n))
        dense[self.edges[:, 0], self.edges[:, 1]] = rank
        tree = minimum_spanning_tree(dense).tocoo()
        return self.column(self.edge_index[tree.row, tree.col])

    def star_centers(self) -> np.ndarray:
        """Peers with a direct two-way link to every other peer: the possible one-hop roots."""
        degree = np.bincount(self.edges.ravel(), minlength=self.n)
        return np.flatnonzero(degree == self.n - 1)

    def star_oracle(self, prices: np.ndarray) -> Column:
        cost = self.edge_costs(prices)
        centers = self.star_centers()
        others = [np.delete(np.arange(self.n), c) for c in centers]
        star_ids = [self.edge_index[c, o] for c, o in zip(centers, others, strict=True)]
        best = int(np.argmin([cost[ids].sum() for ids in star_ids]))
        return self.column(star_ids[best])


class ArborescenceResources:
    """Resource layout for broadcast arborescences: one row per arc, then capped uplinks, then downlinks."""

    def __init__(self, cap: np.ndarray, up: np.ndarray, down: np.ndarray, root: int) -> None:
        self.n = cap.shape[0]
        self.root = root
        src, dst = np.nonzero(cap > 0)
        keep = dst != root  # arcs into the root are never used by an arborescence rooted there
        self.arcs = np.stack([src[keep], dst[keep]], axis=1)
        self.arc_cap = cap[self.arcs[:, 0], self.arcs[:, 1]]
        self.up_rows = np.flatnonzero(np.isfinite(up))
        self.down_rows = np.flatnonzero(np.isfinite(down))
        self.up_cap = up[self.up_rows]
        self.down_cap = down[self.down_rows]
        self.n_resources = len(self.arcs) + len(self.up_rows) + len(self.down_rows)
        self.arc_index = {(int(u), int(v)): i for i, (u, v) in enumerate(self.arcs)}

    def column(self, arc_ids: list[int]) -> Column:
        ids = np.array(sorted(arc_ids), dtype=np.int64)
        use = np.zeros(self.n_resources)
        use[ids] = 1.0 / self.arc_cap[ids]
        base = len(self.arcs)
        out_deg = np.bincount(self.arcs[ids, 0], minlength=self.n)
        in_deg = np.bincount(self.arcs[ids, 1], minlength=self.n)
        use[base : base + len(self.up_rows)] = out_deg[self.up_rows] / self.up_cap
        use[base + len(self.up_rows) :] = in_deg[self.down_rows] / self.down_cap
        return Column(key=tuple(int(i) for i in ids), usage=use)

    def oracle(self, prices: np.ndarray) -> Column:
        base = len(self.arcs)
        per_up = np.zeros(self.n)
        per_down = np.zeros(self.n)
        per_up[self.up_rows] = prices[base : base + len(self.up_rows)] / self.up_cap
        per_down[self.down_rows] = prices[base + len(self.up_rows) :] / self.down_cap
        cost = prices[:base] / self.arc_cap + per_up[self.arcs[:, 0]] + per_down[self.arcs[:, 1]]
        graph = nx.DiGraph()
        graph.add_nodes_from(range(self.n))
        for (u, v), c in zip(self.arcs.tolist(), cost.tolist(), strict=True):
            graph.add_edge(u, v, weight=c)
        arb = nx.minimum_spanning_arborescence(graph, attr="weight", preserve_attrs=False)
        return self.column([self.arc_index[(u, v)] for u, v in arb.edges()])
