"""Stage order: the open path through all stage groups with the least total edge weight.

Exact Held-Karp dynamic programming up to 16 nodes (vectorised by subset size), and nearest-neighbour
starts improved by 2-opt and Or-opt beyond that.
"""

from __future__ import annotations

import itertools

import numpy as np

EXACT_LIMIT = 16


def path_cost(w: np.ndarray, order: list[int]) -> float:
    """Sum of the edge weights along `order`."""
    return float(sum(w[a, b] for a, b in itertools.pairwise(order)))


def held_karp_path(w: np.ndarray) -> tuple[float, list[int]]:
    """Exact minimum-weight open Hamiltonian path (any start, any end); w may be asymmetric."""
    n = w.shape[0]
    if n == 1:
        return 0.0, [0]
    full = 1 << n
    dp = np.full((full, n), np.inf)
    parent = np.full((full, n), -1, dtype=np.int16)
    for j in range(n):
        dp[1 << j, j] = 0.0
    masks = np.arange(full, dtype=np.int64)
    popcount = np.zeros(full, dtype=np.int64)
    for j in range(n):
        popcount += (masks >> j) & 1
    for size in range(1, n):
        layer = masks[popcount == size]
        # extend[m, j, k]: best path over mask m ending at j, then stepping to k.
        extend = dp[layer][:, :, None] + w[None, :, :]
        best = extend.min(axis=1)
        arg = extend.argmin(axis=1)
        for k in range(n):
            free = ((layer >> k) & 1) == 0
            target = layer[free] | (1 << k)
            dp[target, k] = best[free, k]
            parent[target, k] = arg[free, k]
    end = int(np.argmin(dp[full - 1]))
    total = float(dp[full - 1, end])
    order = [end]
    mask = full - 1
    while True:
        prev = int(parent[mask, order[-1]])
        if prev < 0:
            break
        mask ^= 1 << order[-1]
        order.append(prev)
    order.reverse()
    return total, order


def _two_opt(w: np.ndarray, order: list[int]) -> list[int]:
    """Reverse segments while that shortens the path (symmetric weights assumed)."""
    n = len(order)
    improved = True
    while improved:
        improved = False
        for i in range(n - 1):
            for k in range(i + 1, n):
                # Reversing order[i..k] changes the edge into i and the edge out of k.
                before = (w[order[i - 1], order[i]] if i > 0 else 0.0) + (
                    w[order[k], order[k + 1]] if k < n - 1 else 0.0
                )
                after = (w[order[i - 1], order[k]] if i > 0 else 0.0) + (
                    w[order[i], order[k + 1]] if k < n - 1 else 0.0
                )
                if after < before - 1e-12:
                    order[i : k + 1] = order[i : k + 1][::-1]
                    improved = True
    return order


def _or_opt(w: np.ndarray, order: list[int]) -> list[int]:
    """Move single nodes to their best position while that shortens the path (O(1) delta per try)."""
    n = len(order)

    def link(a: int | None, b: int | None) -> float:
        return 0.0 if a is None or b is None else float(w[a, b])

    improved = True
    while improved and n > 2:
        improved = False
        for i in range(n):
            node = order[i]
            prev = order[i - 1] if i > 0 else None
            nxt = order[i + 1] if i < n - 1 else None
            removed = link(prev, node) + link(node, nxt) - link(prev, nxt)
            rest = order[:i] + order[i + 1 :]
            best_pos, best_gain = -1, 1e-12
            for pos in range(n):  # insert between rest[pos-1] and rest[pos]
                left = rest[pos - 1] if pos > 0 else None
                right = rest[pos] if pos < n - 1 else None
                added = link(left, node) + link(node, right) - link(left, right)
                if removed - added > best_gain:
                    best_pos, best_gain = pos, removed - added
            if best_pos >= 0:
                order = [*rest[:best_pos], node, *rest[best_pos:]]
                improved = True
                break
    return order


def heuristic_path(w: np.ndarray, starts: int = 4) -> tuple[float, list[int]]:
    """Nearest-neighbour paths from a few starts, each polished by 2-opt and Or-opt; the best one."""
    n = w.shape[0]
    best: tuple[float, list[int]] | None = None
    for start in sorted(set(np.linspace(0, n - 1, min(starts, n)).astype(int).tolist())):
        order = [start]
        left = set(range(n)) - {start}
        while left:
            nxt = min(left, key=lambda k: (w[order[-1], k], k))
            order.append(nxt)
            left.discard(nxt)
        order = _or_opt(w, _two_opt(w, order))
        cost = path_cost(w, order)
        if best is None or cost < best[0] - 1e-12:
            best = (cost, order)
    assert best is not None
    return best


def open_path(w: np.ndarray, exact_limit: int = EXACT_LIMIT) -> tuple[float, list[int]]:
    """Best open path: exact up to `exact_limit` nodes, heuristic beyond."""
    if w.shape[0] <= exact_limit:
        return held_karp_path(w)
    return heuristic_path(w)
