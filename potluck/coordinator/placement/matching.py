"""Bottleneck perfect matching between two equal-size device groups.

The weight of the pipeline edge between stage groups A and B is the smallest achievable maximum link cost
over all one-to-one pairings of A's devices with B's: pipelines run in lock-step, so the slowest matched
link sets the pace. We find it by threshold search: sort the distinct weights, binary-search the smallest
threshold whose "cheap enough" bipartite graph has a perfect matching (bitmask augmenting paths for small
groups, Hopcroft-Karp from scipy for large ones). One matching test per probe instead of DT-FM's repeated
Hungarian solves.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

# Above this group size the pure-Python bitmask search loses to scipy's Hopcroft-Karp.
_BITMASK_LIMIT = 24


class _Augmenter:
    """Kuhn's augmenting-path search on a bipartite graph held as one column bitmask per row."""

    def __init__(self, rows: list[int], n: int) -> None:
        self.rows = rows  # rows[r]: bitmask of the columns row r may take; callers may add bits
        self.match_col = [-1] * n  # column -> row
        self.row_col = [-1] * n  # row -> column
        self._visited = 0  # columns seen in the current search, as a bitmask

    def try_row(self, r: int) -> bool:
        """Try to match row r, re-routing earlier rows along an augmenting path."""
        self._visited = 0
        return self._augment(r)

    def _augment(self, r: int) -> bool:
        avail = self.rows[r] & ~self._visited
        while avail:
            low = avail & -avail
            c = low.bit_length() - 1
            self._visited |= low
            if self.match_col[c] < 0 or self._augment(self.match_col[c]):
                self.match_col[c], self.row_col[r] = r, c
                return True
            avail &= ~self._visited
        return False


def _incremental_bottleneck(w: np.ndarray, lower: float) -> tuple[float, list[int]]:
    """Small groups: match on entries <= lower, then add edges in increasing weight until perfect.

    Each added edge can only help through an augmenting path that uses it, so we retry augmenting from
    the free rows after every addition; the weight of the edge that completes the matching is the answer.
    """
    n = w.shape[0]
    weights = 1 << np.arange(n, dtype=np.int64)
    aug = _Augmenter([int(v) for v in ((w <= lower) * weights).sum(axis=1)], n)
    free = [r for r in range(n) if not aug.try_row(r)]
    if not free:
        return lower, aug.row_col
    flat = w.ravel()
    for idx in np.argsort(flat, kind="stable"):
        value = float(flat[idx])
        if value <= lower:
            continue
        i, k = divmod(int(idx), n)
        aug.rows[i] |= 1 << k
        free = [r for r in free if not aug.try_row(r)]
        if not free:
            return value, aug.row_col
    raise AssertionError("a complete bipartite graph always has a perfect matching")


def _bitmask_matching(rows: list[int], n: int) -> list[int] | None:
    """Perfect matching of a bipartite graph given as one column bitmask per row; returns col of each row."""
    aug = _Augmenter(rows, n)
    if not all(aug.try_row(r) for r in range(n)):
        return None
    return aug.row_col


def _matching_at(w: np.ndarray, threshold: float) -> list[int] | None:
    """A perfect matching using only entries <= threshold, or None."""
    n = w.shape[0]
    ok = w <= threshold
    if n <= _BITMASK_LIMIT:
        weights = 1 << np.arange(n, dtype=np.int64)
        rows = [int(v) for v in (ok * weights).sum(axis=1)]
        return _bitmask_matching(rows, n)
    match = maximum_bipartite_matching(csr_matrix(ok), perm_type="column")
    if (match < 0).any():
        return None
    return [int(c) for c in match]


def bottleneck_matching(w: np.ndarray) -> tuple[float, list[int]]:
    """Minimum over perfect matchings of the maximum matched weight, and one such matching.

    `w[i, k]` is the cost of pairing row i with column k (seconds). Returns (value, col_of_row).
    """
    n = w.shape[0]
    if n == 1:
        return float(w[0, 0]), [0]
    # Every row and every column needs some partner, so the answer is at least this.
    lower = max(float(w.min(axis=1).max()), float(w.min(axis=0).max()))
    if n <= _BITMASK_LIMIT:
        return _incremental_bottleneck(w, lower)
    found = _matching_at(w, lower)
    if found is not None:
        return lower, found
    values = np.unique(w)
    values = values[values > lower]
    lo, hi = 0, len(values) - 1
    best = _matching_at(w, float(values[hi]))
    assert best is not None  # the full graph always has a perfect matching
    while lo < hi:
        mid = (lo + hi) // 2
        cand = _matching_at(w, float(values[mid]))
        if cand is None:
            lo = mid + 1
        else:
            hi, best = mid, cand
    return float(values[lo]), best


def split_bottleneck_matching(fwd: np.ndarray, bwd: np.ndarray) -> tuple[float, list[int]]:
    """Minimum over perfect matchings of (max matched `fwd`) + (max matched `bwd`), and one such matching.

    A stage boundary on an asymmetric network: the forward phase waits for its slowest activation
    transfer, the backward phase for its slowest gradient transfer, and the two run over opposite
    directions of each matched pair. For each threshold t on the forward side (the distinct values from
    the forward bottleneck up), the best backward side is the bottleneck matching among pairs with
    fwd <= t; the answer is the best t + that. Stops once no larger t can win.
    """
    n = fwd.shape[0]
    if n == 1:
        return float(fwd[0, 0] + bwd[0, 0]), [0]
    low_f, match = bottleneck_matching(fwd)
    low_b, _ = bottleneck_matching(bwd)
    rows = np.arange(n)
    best = float(fwd[rows, match].max() + bwd[rows, match].max())
    best_match = list(match)
    big = float(bwd.max()) * 2.0 + 1.0  # "not allowed": above every real weight
    for t in np.unique(fwd[fwd >= low_f]):
        if float(t) + low_b >= best:
            break
        masked = np.where(fwd <= t, bwd, big)
        value_b, cand = bottleneck_matching(masked)
        if value_b >= big:
            continue
        total = float(fwd[rows, cand].max()) + value_b
        if total < best:
            best, best_match = total, list(cand)
        if value_b <= low_b:
            break  # the backward side is as good as it gets: a larger t only costs more forward
    return best, best_match
