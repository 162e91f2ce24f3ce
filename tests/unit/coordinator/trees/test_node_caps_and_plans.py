"""Node-capacitated and one-hop (butterfly) packing; executor plans and the time model."""

from __future__ import annotations

import numpy as np
import pytest
from hivemind.averaging.load_balancing import optimize_parts_lp

from potluck.coordinator.trees import PackingError, pack_allreduce, pack_rings
from potluck.coordinator.trees.plan import (
    effective_rate,
    predict_allreduce_time,
    ring_plan,
    schedule_tree,
    tree_plan,
)
from potluck.protocol.collective import split_elements
from potluck.testbed.topologies import dgx1v, home_uplinks, lognormal_graph

from .helpers import assert_valid_allreduce


def _hivemind_butterfly_rate(bw: np.ndarray) -> float:
    """D / time of hivemind's butterfly with its own LP shares and traffic accounting."""
    n = len(bw)
    shares = optimize_parts_lp(1_000_000, bw)
    shares = shares / shares.sum()
    return 1.0 / float(np.max((1 + (n - 2) * shares) / bw))


@pytest.mark.parametrize("seed", range(4))
def test_one_hop_with_peer_caps_matches_hivemind_butterfly(seed: int) -> None:
    n = 6 + seed
    bw = home_uplinks(n, seed)
    full = np.full((n, n), 1e9)  # links never bind: only per-peer bandwidth, hivemind's model
    np.fill_diagonal(full, 0)
    star = pack_allreduce(full, node_capacity=bw, one_hop=True)
    assert_valid_allreduce(star, full, bw)
    assert all(len({u for e in edges for u in e}) == n for _, edges in star.trees)
    assert star.rate == pytest.approx(_hivemind_butterfly_rate(bw), rel=1e-5)
    multi = pack_allreduce(full, node_capacity=bw)
    assert_valid_allreduce(multi, full, bw)
    assert multi.rate >= star.rate * (1 - 1e-9)  # stars are trees: never worse than butterfly


def test_peer_caps_bind_and_are_certified() -> None:
    n = 10
    cap = lognormal_graph(n, 7, median=4.0)
    node = home_uplinks(n, 8, median=6.0)
    p = pack_allreduce(cap, node_capacity=node)
    assert_valid_allreduce(p, cap, node)
    free = pack_allreduce(cap)
    assert p.rate <= free.rate * (1 + 1e-9)
    assert p.rate >= 0.95 * p.upper_bound
    assert p.upper_bound <= p.certificate.node_bound * (1 + 1e-12)


def test_asymmetric_up_down_caps_use_the_smaller() -> None:
    cap = np.full((3, 3), 10.0)
    np.fill_diagonal(cap, 0)
    a = pack_allreduce(cap, node_capacity={0: (1.0, 5.0), 1: 5.0, 2: 5.0})
    b = pack_allreduce(cap, node_capacity=[1.0, 5.0, 5.0])
    assert a.rate == pytest.approx(b.rate)
    assert a.rate == pytest.approx(1.0)  # peer 0 has degree >= 1 in every tree


def test_one_hop_needs_a_fully_linked_peer() -> None:
    path = np.array([[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1], [0, 0, 1, 0]], float)
    with pytest.raises(PackingError, match="one-hop"):
        pack_allreduce(path, one_hop=True)


def test_tree_plan_orients_every_tree_from_its_center() -> None:
    cap = dgx1v()
    p = pack_allreduce(cap)
    plan = tree_plan(p.nodes, p.trees)
    assert sum(t.share for t in plan.trees) == pytest.approx(1.0)
    for t, (w, edges) in zip(plan.trees, p.trees, strict=True):
        assert t.weight == w and t.parent[t.root] is None
        assert sorted(map(sorted, t.edges())) == sorted(map(sorted, edges))
        for child, parent in t.parent.items():
            if parent is not None:
                assert child in t.children[parent]
        # no other root gives a shallower tree
        assert all(schedule_tree(p.nodes, edges, w, t.share, root=r).depth >= t.depth for r in p.nodes)
    assert effective_rate(plan, cap) == pytest.approx(p.rate)


def test_schedule_tree_rejects_a_non_tree() -> None:
    with pytest.raises(PackingError, match="spanning tree"):
        schedule_tree([0, 1, 2, 3], [(0, 1), (1, 0), (2, 3)], 1.0, 1.0)


def test_split_elements_is_exact_and_proportional() -> None:
    sizes = split_elements(1001, [0.5, 0.25, 0.25])
    assert sum(sizes) == 1001 and sizes[0] == 501
    assert split_elements(7, [1, 1, 1]) == [3, 2, 2]


def test_model_time_ring_vs_tree_on_fragment_without_nvlink_ring() -> None:
    sub = (0, 1, 2, 3, 4)
    cap = dgx1v()[np.ix_(sub, sub)]
    assert pack_rings(cap).rings == []  # GPU 4 hangs off GPU 0 alone: no NVLink ring
    pcie = np.full((5, 5), 10.0)
    np.fill_diagonal(pcie, 0)
    rings = pack_rings(pcie, node_capacity=[10.0] * 5)  # PCIe: one shared 10 GB/s per GPU
    trees = pack_allreduce(cap)
    d = 1e3  # GB, chunk 1 MB: fill is negligible
    t_ring = predict_allreduce_time(
        ring_plan(rings.nodes, rings.rings), d, pcie, chunk_bytes=1e-3, node_capacity=[10.0] * 5
    )
    t_tree = predict_allreduce_time(tree_plan(trees.nodes, trees.trees), d, cap, chunk_bytes=1e-3)
    assert t_ring / t_tree == pytest.approx(8.0, rel=1e-3)


def test_model_adds_fill_and_latency() -> None:
    cap = dgx1v()
    p = pack_allreduce(cap)
    plan = tree_plan(p.nodes, p.trees)
    base = predict_allreduce_time(plan, 1e3, cap, chunk_bytes=0.0)
    assert base == pytest.approx(1e3 / p.rate)
    filled = predict_allreduce_time(plan, 1e3, cap, chunk_bytes=1.0, latency_s=1e-3)
    depth = max(t.depth for t in plan.trees)
    assert filled - base == pytest.approx((2 * depth - 1) / p.rate + 2 * depth * 1e-3)
    slow = cap / 2
    assert predict_allreduce_time(plan, 1e3, slow, chunk_bytes=0.0) == pytest.approx(2 * base)


def test_trees_beat_butterfly_when_nat_removes_links() -> None:
    # Peer 0 is public; 1-4 are behind NAT with only 1-2 and 3-4 hole-punched. Every peer caps at 1.
    cap = np.zeros((5, 5))
    for u, v in [(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (3, 4)]:
        cap[u, v] = cap[v, u] = 10.0
    caps = [1.0] * 5
    star = pack_allreduce(cap, node_capacity=caps, one_hop=True)
    assert star.rate == pytest.approx(1 / 4)  # the only star is rooted at 0: degree 4 * R <= 1
    multi = pack_allreduce(cap, node_capacity=caps)
    assert_valid_allreduce(multi, cap, caps)
    # trees {0-1, 1-2, 0-3, 3-4} and {0-2, 2-1, 0-4, 4-3} at 0.25 each load peer 0 with 1, others 0.75
    assert multi.rate >= 0.5 - 1e-9
    assert multi.upper_bound <= 5 / 8 + 1e-9  # 5 peers x cap 1 over 2(N - 1) = 8 edge ends per tree
