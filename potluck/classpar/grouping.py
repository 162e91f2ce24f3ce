"""Class grouping: even (equal-size) k-means on each class's mean penultimate feature vector.

sensAI groups classes whose features are close, so that each sub-network separates classes that look
alike from everything else. Groups must be of equal size (sizes differ by at most one when G does not
divide K): every sub-network then has the same width of output and, with coding, the same payload.

Assignment with capacities is a linear assignment problem: each centroid is repeated once per slot and
the Hungarian method (scipy) places every class in a slot at the least total squared distance. The
update step is the usual mean. Restarts from seeded k-means++ starts keep the least inertia.
"""

from __future__ import annotations

import logging

import numpy as np
from scipy.optimize import linear_sum_assignment

from potluck.classpar.errors import GroupingError

logger = logging.getLogger(__name__)

Groups = list[list[int]]  # class indices of each group, each sorted; groups ordered by their first class


def group_sizes(num_classes: int, num_groups: int) -> list[int]:
    """Sizes of ``num_groups`` groups of ``num_classes``, differing by at most one, larger first."""
    if not 1 <= num_groups <= num_classes:
        raise GroupingError(f"cannot split {num_classes} classes into {num_groups} non-empty groups")
    base, extra = divmod(num_classes, num_groups)
    return [base + 1 if g < extra else base for g in range(num_groups)]


def contiguous_groups(num_classes: int, num_groups: int) -> Groups:
    """Classes in index order cut into equal runs (what sensAI does on ImageNet)."""
    out: Groups = []
    start = 0
    for size in group_sizes(num_classes, num_groups):
        out.append(list(range(start, start + size)))
        start += size
    return out


def _canonical(labels: np.ndarray, num_groups: int) -> Groups:
    groups = [sorted(int(i) for i in np.flatnonzero(labels == g)) for g in range(num_groups)]
    return sorted(groups, key=lambda g: g[0])


def _assign(points: np.ndarray, centroids: np.ndarray, sizes: list[int]) -> tuple[np.ndarray, float]:
    slots = np.repeat(np.arange(len(sizes)), sizes)  # slot -> centroid
    cost = ((points[:, None, :] - centroids[slots][None, :, :]) ** 2).sum(axis=2)
    rows, cols = linear_sum_assignment(cost)
    labels = np.empty(len(points), dtype=np.int64)
    labels[rows] = slots[cols]
    return labels, float(cost[rows, cols].sum())


def _plus_plus(points: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    chosen = [int(rng.integers(len(points)))]
    for _ in range(1, k):
        d2 = ((points[:, None, :] - points[chosen][None, :, :]) ** 2).sum(axis=2).min(axis=1)
        total = d2.sum()
        probs = d2 / total if total > 0 else np.full(len(points), 1.0 / len(points))
        chosen.append(int(rng.choice(len(points), p=probs)))
    return points[chosen].copy()


def even_kmeans(
    points: np.ndarray, num_groups: int, *, seed: int = 0, restarts: int = 8, max_iter: int = 100
) -> Groups:
    """Split the rows of ``points`` (one per class) into ``num_groups`` groups of equal size."""
    pts = np.asarray(points, dtype=np.float64)
    if pts.ndim != 2:
        raise GroupingError(f"expected one feature row per class, got an array of shape {pts.shape}")
    sizes = group_sizes(len(pts), num_groups)
    rng = np.random.default_rng(seed)
    best: tuple[float, np.ndarray] | None = None
    for _ in range(restarts):
        centroids = _plus_plus(pts, num_groups, rng)
        labels, inertia = _assign(pts, centroids, sizes)
        for _ in range(max_iter):
            centroids = np.stack([pts[labels == g].mean(axis=0) for g in range(num_groups)])
            new, inertia = _assign(pts, centroids, sizes)
            if np.array_equal(new, labels):
                break
            labels = new
        if best is None or inertia < best[0] - 1e-12:
            best = (inertia, labels)
    assert best is not None
    groups = _canonical(best[1], num_groups)
    logger.debug("even k-means: %d groups, inertia %.4g: %s", num_groups, best[0], groups)
    return groups


def class_order(groups: Groups) -> list[int]:
    """The classes in the order the groups' outputs are concatenated (the merge permutation)."""
    return [c for group in groups for c in group]
