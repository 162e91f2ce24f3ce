"""Structured starting placements, built from clusters of peers found in the link matrix.

Peers that share a data centre, a city or a multi-GPU host have fast links between them. We find such
clusters by average-linkage clustering of the pipeline link weight, then lay out the S x R grid of
(stage, pipeline) slots:
- pipelines inside clusters, replicas across them ("strided"),
- stage groups inside clusters, pipelines across them ("contiguous", the transpose),
- block-aligned: column blocks where every pipeline runs a segment of consecutive stages inside one
  cluster, aligned so that the fast boundaries coincide across pipelines (the bottleneck of a boundary is
  its slowest pipeline, so one slow pipeline spoils it for all).
"""

from __future__ import annotations

import numpy as np
from scipy.cluster.hierarchy import fcluster, leaves_list, linkage
from scipy.spatial.distance import squareform


def cluster_levels(weight: np.ndarray, devices: np.ndarray, max_levels: int = 4) -> tuple[np.ndarray, list]:
    """Leaf order of `devices` (clusters contiguous at every level) and up to `max_levels` clusterings.

    Each clustering is a list of clusters (lists of device ids in leaf order), cut where the merge height
    jumps the most (the natural boundaries: host, site, region).
    """
    if len(devices) < 3:
        return devices.copy(), [[devices.tolist()]]
    sub = weight[np.ix_(devices, devices)]
    sym = (sub + sub.T) / 2.0
    np.fill_diagonal(sym, 0.0)
    tree = linkage(squareform(sym, checks=False), method="average")
    order = devices[leaves_list(tree)]
    heights = tree[:, 2]
    uniq = np.unique(heights)
    levels: list[list[list[int]]] = []
    if len(uniq) > 1:
        # Cut midway inside the largest relative gaps between consecutive distinct merge heights.
        gaps = (uniq[1:] - uniq[:-1]) / np.maximum(uniq[1:], 1e-12)
        for k in np.argsort(-gaps)[:max_levels]:
            cut = (uniq[k] + uniq[k + 1]) / 2.0
            labels = fcluster(tree, t=cut, criterion="distance")
            by_label: dict[int, list[int]] = {}
            rank = {int(d): i for i, d in enumerate(order)}
            pairs = sorted(zip(devices.tolist(), labels.tolist(), strict=True), key=lambda x: rank[x[0]])
            for d, lab in pairs:
                by_label.setdefault(int(lab), []).append(int(d))
            clusters = sorted(by_label.values(), key=lambda c: rank[c[0]])
            if 1 < len(clusters) < len(devices):
                levels.append(clusters)
    if not levels:
        levels.append([order.tolist()])
    return order, levels


def strided(order: np.ndarray, s: int, r: int) -> np.ndarray:
    """Pipelines are consecutive runs of the leaf order; returns stage groups (S x R)."""
    return order[: s * r].reshape(r, s).T.copy()


def contiguous(order: np.ndarray, s: int, r: int) -> np.ndarray:
    """Stage groups are consecutive runs of the leaf order."""
    return order[: s * r].reshape(s, r).copy()


def block_aligned(clusters: list[list[int]], s: int, r: int, first_width: int) -> np.ndarray | None:
    """Grid filled by aligned column blocks of same-cluster segments; None if it cannot be built.

    The first block has width `first_width`; later blocks take the widest width that R segments still
    fit. Width-1 columns are stage groups taken in leaf order (so they stay inside clusters).
    """
    pool = [list(c) for c in clusters]
    grid = np.full((r, s), -1, dtype=np.int64)
    col, width = 0, first_width
    while col < s:
        width = min(width, s - col)
        while width > 1 and sum(len(c) // width for c in pool) < r:
            width -= 1
        if width <= 1:
            rest = [d for c in pool for d in c]
            if len(rest) < r * (s - col):
                return None
            grid[:, col:] = np.array(rest[: r * (s - col)]).reshape(s - col, r).T
            break
        for i in range(r):
            c = max(range(len(pool)), key=lambda k: (len(pool[k]), -k))
            grid[i, col : col + width] = pool[c][:width]
            pool[c] = pool[c][width:]
        col += width
        width = s
    return grid.T.copy()


def restrict(clustering: tuple[np.ndarray, list], devices: np.ndarray) -> tuple[np.ndarray, list]:
    """A clustering of a superset, cut down to `devices` (clustering once serves every shape)."""
    keep = set(devices.tolist())
    order = np.array([d for d in clustering[0].tolist() if d in keep], dtype=np.int64)
    levels = [[c2 for c2 in ([d for d in c if d in keep] for c in lvl) if c2] for lvl in clustering[1]]
    return order, levels


def template_partitions(
    weight: np.ndarray, devices: np.ndarray, s: int, r: int, clustering: tuple[np.ndarray, list] | None = None
) -> list[tuple[str, np.ndarray]]:
    """Named candidate partitions (S x R stage groups) from the cluster structure of `devices`."""
    if clustering is None:
        order, levels = cluster_levels(weight, devices)
    else:
        order, levels = restrict(clustering, devices)
    out: list[tuple[str, np.ndarray]] = [
        ("strided", strided(order, s, r)),
        ("contiguous", contiguous(order, s, r)),
    ]
    for li, clusters in enumerate(levels):
        sizes = sorted({min(len(c), s) for c in clusters} | {s}, reverse=True)
        for width in sizes:
            if width < 2:
                continue
            grid = block_aligned(clusters, s, r, width)
            if grid is not None:
                out.append((f"aligned-L{li}-w{width}", grid))
    return out
