"""Reference topologies for packing tests and benchmarks: DGX-1V / DGX-1P NVLink graphs, random graphs.

Capacities are in GB/s per direction. DGX-1V (V100): 6 NVLinks per GPU in a hybrid cube-mesh, some GPU
pairs joined by two links (2 x 25 GB/s). DGX-1P (P100): 4 NVLinks per GPU, two fully connected quads
0-3 and 4-7 plus i <-> i+4. PCIe (the fallback of NCCL rings when no NVLink ring exists) is modelled as
one shared 10 GB/s per GPU. All functions are pure; random graphs take an explicit seed.
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy.sparse.csgraph import connected_components

NVLINK_GBPS = 25.0  # one NVLink 2.0 per direction; P100's NVLink 1.0 is 20 GB/s
NVLINK1_GBPS = 20.0
PCIE_GBPS = 10.0

# (gpu, gpu): number of NVLinks, from `nvidia-smi topo -m` on a DGX-1V.
DGX1V_LINKS: dict[tuple[int, int], int] = {
    (0, 1): 1,
    (0, 2): 1,
    (0, 3): 2,
    (0, 4): 2,
    (1, 2): 2,
    (1, 3): 1,
    (1, 5): 2,
    (2, 3): 2,
    (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1,
    (4, 6): 1,
    (4, 7): 2,
    (5, 6): 2,
    (5, 7): 1,
    (6, 7): 2,
}
DGX1P_LINKS: dict[tuple[int, int], int] = {
    **{(a, b): 1 for a, b in itertools.combinations(range(4), 2)},
    **{(a + 4, b + 4): 1 for a, b in itertools.combinations(range(4), 2)},
    **{(i, i + 4): 1 for i in range(4)},
}


def link_matrix(links: dict[tuple[int, int], int], per_link: float, n: int = 8) -> np.ndarray:
    """Symmetric n x n capacity matrix from a link-count table."""
    cap = np.zeros((n, n))
    for (a, b), count in links.items():
        cap[a, b] = cap[b, a] = count * per_link
    return cap


def dgx1v() -> np.ndarray:
    return link_matrix(DGX1V_LINKS, NVLINK_GBPS)


def dgx1p() -> np.ndarray:
    return link_matrix(DGX1P_LINKS, NVLINK1_GBPS)


def connected_subsets(cap: np.ndarray, sizes: range = range(3, 9)) -> list[tuple[int, ...]]:
    """All GPU subsets of the given sizes whose induced NVLink graph is connected, in lexicographic order."""
    out = []
    for k in sizes:
        for subset in itertools.combinations(range(cap.shape[0]), k):
            sub = cap[np.ix_(subset, subset)]
            if connected_components(sub > 0, directed=True, connection="strong")[0] == 1:
                out.append(subset)
    return out


def lognormal_graph(
    n: int,
    seed: int,
    *,
    sigma: float = 1.0,
    density: float = 1.0,
    median: float = 1.0,
    symmetric: bool = False,
) -> np.ndarray:
    """Random capacities: lognormal(log median, sigma) per direction; each pair kept with `density`.

    A ring 0 -> 1 -> ... -> 0 is always kept so the graph is connected. symmetric=True draws one rate
    per pair (both directions equal).
    """
    rng = np.random.default_rng(seed)
    cap = rng.lognormal(np.log(median), sigma, size=(n, n))
    if symmetric:
        cap = np.triu(cap, 1) + np.triu(cap, 1).T
    keep = np.triu(rng.random((n, n)) < density, 1)
    keep = keep | keep.T
    ring = np.arange(n)
    keep[ring, (ring + 1) % n] = keep[(ring + 1) % n, ring] = True
    cap = np.where(keep, cap, 0.0)
    np.fill_diagonal(cap, 0.0)
    return cap


def home_uplinks(n: int, seed: int, *, sigma: float = 1.0, median: float = 1.0) -> np.ndarray:
    """Per-peer caps (lognormal) for the node-capacitated model of home peers."""
    return np.random.default_rng(seed).lognormal(np.log(median), sigma, size=n)
