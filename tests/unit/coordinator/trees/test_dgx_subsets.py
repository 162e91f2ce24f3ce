"""B1/B2/B3/B4 on every strongly-connected 3-8 GPU subset of DGX-1V and DGX-1P (181 each)."""

from __future__ import annotations

import numpy as np
import pytest

from potluck.coordinator.trees import exact_strength, pack_allreduce, pack_broadcast, pack_rings
from potluck.coordinator.trees.bounds import broadcast_bound
from potluck.coordinator.trees.graph import make_network
from potluck.coordinator.trees.plan import predict_allreduce_time, ring_plan, tree_plan
from potluck.testbed.topologies import connected_subsets, dgx1p, dgx1v

from .helpers import assert_valid_allreduce, assert_valid_broadcast

# Packing searches over 181 subsets: 3-6 s a test alone, one took 10.1 s in a loaded commit tier
# (2026-11-29), over the fast tier's 10 s guard.
pytestmark = pytest.mark.slow

MACHINES = {"dgx1v": dgx1v(), "dgx1p": dgx1p()}


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_subset_count(machine: str) -> None:
    assert len(connected_subsets(MACHINES[machine])) == 181


@pytest.mark.slow  # packs and certifies all 181 subsets: 6-14 s a machine
@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_allreduce_reaches_partition_bound_on_every_subset(machine: str) -> None:
    full = MACHINES[machine]
    counts = []
    for subset in connected_subsets(full):
        cap = full[np.ix_(subset, subset)]
        p = pack_allreduce(cap, certify_broadcast=False)
        assert_valid_allreduce(p, cap)
        strength, _ = exact_strength(make_network(cap))
        assert p.certificate.partition_exact
        assert p.upper_bound <= strength * (1 + 1e-9)
        assert p.rate >= 0.99 * strength, (subset, p.rate, strength)
        assert len(p.trees) <= 2 * len(subset)
        counts.append(len(p.trees))
    assert max(counts) <= 16


@pytest.mark.slow  # packs trees and rings on all 181 subsets: 4-8 s a machine
@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_tree_model_never_slower_than_ring(machine: str) -> None:
    # A theorem of the model (reverse and average the rings, cut them into paths): failure = a bug.
    full = MACHINES[machine]
    for subset in connected_subsets(full):
        cap = full[np.ix_(subset, subset)]
        rings = pack_rings(cap)
        if not rings.rings:
            continue  # no NVLink ring: NCCL falls back to PCIe, a different (slower) network
        trees = pack_allreduce(cap, certify_broadcast=False)
        d, chunk = 1e9, 1e6
        t_tree = predict_allreduce_time(tree_plan(trees.nodes, trees.trees), d, cap, chunk_bytes=chunk)
        t_ring = predict_allreduce_time(ring_plan(rings.nodes, rings.rings), d, cap, chunk_bytes=chunk)
        assert trees.rate >= 0.995 * rings.allreduce_rate, subset
        assert t_tree <= 1.01 * t_ring + 8 * chunk / trees.rate, subset


@pytest.mark.parametrize("subset", [(0, 1, 2), (0, 1, 2, 3, 4), (0, 1, 2, 3, 4, 5, 6, 7), (1, 2, 5, 6)])
def test_broadcast_reaches_edmonds_bound_from_every_root(subset: tuple[int, ...]) -> None:
    cap = dgx1v()[np.ix_(subset, subset)]
    for root in range(len(subset)):
        p = pack_broadcast(cap, root, max_trees=64)  # B1 is about the LP rate, not the tree count
        assert_valid_broadcast(p, cap, root)
        lam = broadcast_bound(cap, root)
        assert p.upper_bound <= lam * (1 + 1e-9)
        assert p.rate >= 0.99 * lam, (subset, root, p.rate, lam)


def test_full_dgx1v_numbers() -> None:
    cap = dgx1v()
    p = pack_allreduce(cap)
    # 8 GPUs x 6 links x 25 GB/s / 2 = 600 GB/s of links; all-singletons partition: 600 / 7.
    assert p.upper_bound == pytest.approx(600 / 7)
    assert p.certificate.broadcast_bound == pytest.approx(150.0, rel=1e-5)
    assert pack_broadcast(cap, 0, max_trees=64).rate >= 0.99 * 150.0
