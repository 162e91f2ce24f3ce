"""Ring packing: the NCCL-style baseline the tree plans are compared against.

A ring is a directed Hamiltonian cycle; ring all-reduce (reduce-scatter then all-gather) of D bytes over
rings of total weight B takes 2 (N - 1) / N * D / B, so its all-reduce rate is B * N / (2 (N - 1)). Each
ring loads one direction of each of its links and one uplink/downlink per peer. For N <= 9 all cycles
are enumerated ((N-1)! <= 40,320) and the LP over them is exact; above that the candidates come from a
deterministic widest-next-hop heuristic under multiplicative prices (a baseline, not a bound).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

import numpy as np

from potluck.coordinator.errors import PackingError
from potluck.coordinator.trees.core import Column, solve_lp
from potluck.coordinator.trees.graph import CapacityInput, NodeCapacityInput, make_network

MAX_ENUMERATED = 9
_HEURISTIC_ROUNDS_PER_PEER = 4
_HEURISTIC_EPS = 0.5  # price growth per unit use: large, to spread candidates over the links


@dataclass(frozen=True)
class RingPacking:
    nodes: tuple[Hashable, ...]
    rings: list[tuple[float, list[Hashable]]]  # (weight, peer order), heaviest first
    rate: float  # sum of ring weights (bytes/s per link direction)
    exact: bool  # True when every Hamiltonian cycle was a candidate (the rate is the optimum)

    @property
    def allreduce_rate(self) -> float:
        """D / time for a ring all-reduce of D bytes: rate * N / (2 (N - 1)); 0 without a ring."""
        n = len(self.nodes)
        return self.rate * n / (2 * (n - 1))


def _cycles(adj: np.ndarray) -> Iterator[tuple[int, ...]]:
    """Directed Hamiltonian cycles through node 0 (each once), by depth-first search."""
    n = adj.shape[0]
    path = [0]
    seen = [False] * n
    seen[0] = True

    def extend() -> Iterator[tuple[int, ...]]:
        u = path[-1]
        if len(path) == n:
            if adj[u, 0]:
                yield tuple(path)
            return
        for v in np.flatnonzero(adj[u]).tolist():
            if not seen[v]:
                seen[v] = True
                path.append(v)
                yield from extend()
                path.pop()
                seen[v] = False

    yield from extend()


class _RingResources:
    def __init__(self, cap: np.ndarray, up: np.ndarray, down: np.ndarray) -> None:
        self.n = cap.shape[0]
        self.cap = cap
        self.up_rows = np.flatnonzero(np.isfinite(up))
        self.down_rows = np.flatnonzero(np.isfinite(down))
        self.up, self.down = up[self.up_rows], down[self.down_rows]
        self.n_arcs = self.n * self.n
        self.n_resources = self.n_arcs + len(self.up_rows) + len(self.down_rows)

    def column(self, order: tuple[int, ...]) -> Column:
        src = np.array(order)
        dst = np.roll(src, -1)
        arcs = src * self.n + dst
        use = np.zeros(self.n_resources)
        use[arcs] = 1.0 / self.cap[src, dst]
        use[self.n_arcs : self.n_arcs + len(self.up_rows)] = 1.0 / self.up
        use[self.n_arcs + len(self.up_rows) :] = 1.0 / self.down
        return Column(key=order, usage=use)

    def widest_tour(self, prices: np.ndarray, start: int) -> tuple[int, ...] | None:
        """Greedy tour from start: always the cheapest (price / capacity) arc to an unvisited peer."""
        cost = np.where(
            self.cap > 0,
            prices[: self.n_arcs].reshape(self.n, self.n) / np.where(self.cap > 0, self.cap, 1.0),
            np.inf,
        )
        order, seen = [start], {start}
        while len(order) < self.n:
            row = cost[order[-1]].copy()
            row[list(seen)] = np.inf
            nxt = int(np.argmin(row))
            if not math.isfinite(row[nxt]):
                return None
            order.append(nxt)
            seen.add(nxt)
        if self.cap[order[-1], start] <= 0:
            return None
        k = order.index(0)  # canonical rotation: starts at peer 0
        return tuple(order[k:] + order[:k])


def pack_rings(capacity: CapacityInput, *, node_capacity: NodeCapacityInput | None = None) -> RingPacking:
    """Fractional packing of directed Hamiltonian rings (rate 0 and no rings when none exists)."""
    net = make_network(capacity, node_capacity)
    if net.n < 2:
        raise PackingError(f"a collective needs at least 2 peers, got {net.n}")
    scale = float(net.cap.max()) or 1.0
    res = _RingResources(net.cap / scale, net.up / scale, net.down / scale)
    exact = net.n <= MAX_ENUMERATED
    if exact:
        columns = [res.column(c) for c in _cycles(net.cap > 0)]
    else:
        prices = np.ones(res.n_resources)
        found: dict[tuple[int, ...], Column] = {}
        for k in range(_HEURISTIC_ROUNDS_PER_PEER * net.n):
            tour = res.widest_tour(prices, k % net.n)
            if tour is None:
                continue
            col = found.setdefault(tour, res.column(tour))
            prices *= 1.0 + _HEURISTIC_EPS * col.bottleneck * col.usage
        columns = list(found.values())
    if not columns:
        return RingPacking(nodes=net.nodes, rings=[], rate=0.0, exact=exact)
    weights, _ = solve_lp(columns)
    kept = sorted(
        ((float(w) * scale, c) for w, c in zip(weights, columns, strict=True) if w > 1e-12),
        key=lambda t: -t[0],
    )
    rings = [(w, [net.nodes[i] for i in c.key]) for w, c in kept]
    return RingPacking(nodes=net.nodes, rings=rings, rate=sum(w for w, _ in rings), exact=exact)
