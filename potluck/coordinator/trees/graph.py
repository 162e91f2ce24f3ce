"""Input normalisation for the packers: node labels, capacity matrices, per-peer caps.

Every packer works on dense numpy matrices indexed 0..N-1; this module turns the caller's mapping or
matrix into that form once and checks it, so the numeric code never sees labels or bad values.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.sparse.csgraph import connected_components

from potluck.coordinator.errors import PackingError

# A capacity is either a mapping u -> {v: rate} or an N x N matrix (rows = senders), rates in bytes/s
# (any unit works as long as it is the same everywhere; the packing rate comes back in that unit).
CapacityInput = Mapping[Hashable, Mapping[Hashable, float]] | Sequence[Sequence[float]] | np.ndarray
# A per-peer cap is one rate (shared by upload and download) or an (upload, download) pair.
NodeCap = float | tuple[float, float]
NodeCapacityInput = Mapping[Hashable, NodeCap] | Sequence[NodeCap] | np.ndarray


@dataclass(frozen=True)
class Network:
    """A data-parallel group as the packers see it.

    cap[u, v] is the rate from u to v (0 = no direct link). up/down are per-peer upload/download caps
    (inf where the caller gave none). All arrays are float64 and read-only by convention.
    """

    nodes: tuple[Hashable, ...]
    cap: np.ndarray
    up: np.ndarray
    down: np.ndarray

    @property
    def n(self) -> int:
        return len(self.nodes)

    @property
    def has_node_caps(self) -> bool:
        return bool(np.isfinite(self.up).any() or np.isfinite(self.down).any())

    def sym(self) -> np.ndarray:
        """Per-edge rate usable by a tree edge, which carries the same bytes in both directions."""
        return np.minimum(self.cap, self.cap.T)

    def undirected_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(E x 2 array of u < v with a usable two-way link, their capacities)."""
        sym = self.sym()
        iu, iv = np.nonzero(np.triu(sym, k=1) > 0)
        return np.stack([iu, iv], axis=1), sym[iu, iv]

    def node_tree_cap(self) -> np.ndarray:
        """Per-peer cap on the sum over trees of weight x degree (a tree edge loads both directions)."""
        return np.minimum(self.up, self.down)


def _labels_and_matrix(capacity: CapacityInput) -> tuple[tuple[Hashable, ...], np.ndarray]:
    if isinstance(capacity, Mapping):
        labels: list[Hashable] = list(capacity.keys())
        for row in capacity.values():
            labels.extend(v for v in row if v not in capacity)
        index = {u: i for i, u in enumerate(labels)}
        mat = np.zeros((len(labels), len(labels)))
        for u, row in capacity.items():
            for v, rate in row.items():
                mat[index[u], index[v]] = float(rate)
        return tuple(labels), mat
    mat = np.array(capacity, dtype=np.float64)
    if mat.ndim != 2 or mat.shape[0] != mat.shape[1]:
        raise PackingError(f"capacity must be a square matrix, got shape {mat.shape}")
    return tuple(range(mat.shape[0])), mat


def _node_caps(
    node_capacity: NodeCapacityInput | None, nodes: tuple[Hashable, ...]
) -> tuple[np.ndarray, np.ndarray]:
    up = np.full(len(nodes), math.inf)
    down = np.full(len(nodes), math.inf)
    if node_capacity is None:
        return up, down
    items: list[tuple[int, Any]]
    if isinstance(node_capacity, Mapping):
        index = {u: i for i, u in enumerate(nodes)}
        unknown = [u for u in node_capacity if u not in index]
        if unknown:
            raise PackingError(f"node_capacity names peers not in capacity: {unknown[:5]}")
        items = [(index[u], c) for u, c in node_capacity.items()]
    else:
        seq = list(node_capacity)
        if len(seq) != len(nodes):
            raise PackingError(f"node_capacity has {len(seq)} entries for {len(nodes)} peers")
        items = list(enumerate(seq))
    for i, c in items:
        if isinstance(c, tuple | list | np.ndarray) and len(c) == 2:
            up[i], down[i] = float(c[0]), float(c[1])
        else:
            up[i] = down[i] = float(c)
    if np.isnan(up).any() or np.isnan(down).any() or (up <= 0).any() or (down <= 0).any():
        raise PackingError("every node capacity must be a positive rate (use no entry for 'uncapped')")
    return up, down


def make_network(capacity: CapacityInput, node_capacity: NodeCapacityInput | None = None) -> Network:
    """Check and normalise the inputs; raise PackingError with the reason when they are unusable."""
    nodes, mat = _labels_and_matrix(capacity)
    if not np.isfinite(mat).all() or (mat < 0).any():
        raise PackingError("capacities must be finite and non-negative (0 = no direct link)")
    np.fill_diagonal(mat, 0.0)
    up, down = _node_caps(node_capacity, nodes)
    return Network(nodes=nodes, cap=mat, up=up, down=down)


def require_spanning(net: Network, sym: bool) -> None:
    """Raise unless a spanning tree exists (two-way links for all-reduce, any link for broadcast)."""
    if net.n < 2:
        raise PackingError(f"a collective needs at least 2 peers, got {net.n}")
    adj = net.sym() if sym else net.cap
    ncomp, _ = connected_components(adj > 0, directed=not sym, connection="strong")
    if ncomp > 1:
        kind = "two-way links" if sym else "directed links"
        raise PackingError(f"the group is not connected by {kind} ({ncomp} components): no spanning tree")
