"""predict_allreduce_time's per-message handling costs (message_s, message_byte_s, shared_loop)."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest

from potluck.coordinator.trees import pack_allreduce
from potluck.coordinator.trees.plan import TreePlan, predict_allreduce_time, ring_plan, tree_plan
from potluck.testbed.topologies import dgx1v, lognormal_graph


def _ones(n: int) -> np.ndarray:
    cap = np.ones((n, n))  # bytes/s
    np.fill_diagonal(cap, 0.0)
    return cap


def _path3() -> TreePlan:
    """One tree 0 - 1 - 2 of weight 1 on unit links: rooted at its center 1, depth 1, R = 1 byte/s."""
    return tree_plan([0, 1, 2], [(1.0, [(0, 1), (1, 2)])])


def test_zero_cost_is_the_bandwidth_model() -> None:
    plan = _path3()
    cap = _ones(3)
    # 8 bytes in chunks of 2: 8 / R + (2 depth - 1) * 2 / R + 2 depth * latency
    old = 8.0 + 1 * 2.0 + 2 * 0.5
    for shared in (False, True):
        t = predict_allreduce_time(
            plan,
            8.0,
            cap,
            chunk_bytes=2.0,
            latency_s=0.5,
            message_s=0.0,
            message_byte_s=0.0,
            shared_loop=shared,
        )
        assert t == pytest.approx(old)
    ring = ring_plan([0, 1, 2], [(1.0, [0, 1, 2])])
    # 2 (N - 1) / N * 9 / B + min(chunk, 9 / N) / B + 2 (N - 1) latencies
    assert predict_allreduce_time(ring, 9.0, cap, chunk_bytes=100.0, message_s=0.0) == pytest.approx(12 + 3)
    # zero costs need no chunking: chunk_bytes = 0 stays allowed (fill-free bandwidth model)
    assert predict_allreduce_time(plan, 8.0, cap, chunk_bytes=0.0) == pytest.approx(8.0)


def test_tree_pipeline_and_loop_terms_by_hand() -> None:
    plan = _path3()
    cap = _ones(3)

    # 4 chunks; a message end of the tree costs m = a + b * 2 bytes; the root has 2 children, so h = 3;
    # the tree's 4 + 2 * 1 - 1 = 5 pipeline steps each grow by 3 m: 10 + 15 m.
    # Loops per chunk: peer 1 handles 4 ends (2 edges, up and down), peers 0 and 2 handle 2 each.
    def t(a: float, b: float, shared: bool) -> float:
        return predict_allreduce_time(
            plan, 8.0, cap, chunk_bytes=2.0, message_s=a, message_byte_s=b, shared_loop=shared
        )

    assert t(0.1, 0.0, False) == pytest.approx(10 + 15 * 0.1)  # pipeline binds
    assert t(0.1, 0.0, True) == pytest.approx(10 + 15 * 0.1)  # loop: 4 chunks x 8 ends x 0.1 = 3.2 < 11.5
    assert t(1.0, 0.0, False) == pytest.approx(25.0)  # pipeline 25 > busiest loop 4 x 4 x 1 = 16
    assert t(1.0, 0.0, True) == pytest.approx(32.0)  # one loop for all: 4 chunks x 8 ends x 1
    assert t(0.5, 0.25, False) == pytest.approx(10 + 15 * (0.5 + 0.25 * 2))  # m for 2-byte messages


def test_ring_terms_by_hand() -> None:
    ring = ring_plan([0, 1, 2], [(1.0, [0, 1, 2])])
    cap = _ones(3)
    # base 15 (see above); 2 (N - 1) = 4 steps of one 3-byte segment out and one in: 8 handlings of m.
    m = 1.0 + 0.5 * 3
    per_peer = predict_allreduce_time(ring, 9.0, cap, chunk_bytes=100.0, message_s=1.0, message_byte_s=0.5)
    assert per_peer == pytest.approx(15 + 8 * m)
    shared = predict_allreduce_time(
        ring, 9.0, cap, chunk_bytes=100.0, message_s=1.0, message_byte_s=0.5, shared_loop=True
    )
    assert shared == pytest.approx(3 * 8 * m)  # the one loop handles 3 peers' 8 ends: 60 > 35


@pytest.mark.parametrize("shared", [False, True])
def test_monotonic_in_message_costs(shared: bool) -> None:
    cap = lognormal_graph(6, seed=3, sigma=0.7, median=4.0)
    p = pack_allreduce(cap)
    plan = tree_plan(p.nodes, p.trees)
    d, chunk = 8.0, 0.25  # 32 chunks

    def t(a: float, b: float) -> float:
        return predict_allreduce_time(
            plan, d, cap, chunk_bytes=chunk, message_s=a, message_byte_s=b, shared_loop=shared
        )

    base = t(0.0, 0.0)
    fixed = [t(a, 0.0) for a in (0.0, 1e-4, 1e-3, 1e-2, 1e-1)]
    per_byte = [t(0.0, b) for b in (0.0, 1e-4, 1e-3, 1e-2, 1e-1)]
    for series in (fixed, per_byte):
        assert series[0] == pytest.approx(base)
        assert all(later > earlier for earlier, later in pairwise(series))
    assert t(1e-2, 0.0) <= predict_allreduce_time(
        plan, d, cap, chunk_bytes=chunk, message_s=1e-2, shared_loop=True
    ) * (1 + 1e-12)  # one loop for all peers is never faster than one loop per peer


def test_smaller_chunks_cost_more_messages() -> None:
    cap = dgx1v()
    p = pack_allreduce(cap)
    plan = tree_plan(p.nodes, p.trees)
    d = 1.0  # GB; 1 ms per message end
    coarse, fine = (
        predict_allreduce_time(plan, d, cap, chunk_bytes=c, message_s=1e-3, shared_loop=True)
        for c in (1e-2, 1e-4)
    )
    assert fine > coarse
    # 10^4 chunks, every chunk of every tree handled twice per edge end: the loop bound is exact here
    ends = sum(4 * (len(p.nodes) - 1) for _ in plan.trees)
    assert fine == pytest.approx(1e4 * ends * 1e-3)


def test_bad_costs_are_rejected() -> None:
    plan = _path3()
    cap = _ones(3)
    for a, b in ((-1.0, 0.0), (0.0, -1.0), (math.nan, 0.0)):
        with pytest.raises(ValueError, match="per-message costs"):
            predict_allreduce_time(plan, 8.0, cap, chunk_bytes=2.0, message_s=a, message_byte_s=b)
    with pytest.raises(ValueError, match="chunk_bytes"):
        predict_allreduce_time(plan, 8.0, cap, chunk_bytes=0.0, message_s=1e-3)


def test_chooser_prefers_stars_when_equal_and_trees_when_faster():
    from potluck.coordinator.trees.plan import choose_tree_plan, predict_allreduce_time

    n = 6
    uniform = [[0.0 if i == j else 1e6 for j in range(n)] for i in range(n)]
    plan = choose_tree_plan(list(range(n)), uniform, 8e6, chunk_bytes=1e6, node_capacity=[1e6] * n)
    assert max(t.depth for t in plan.trees) == 1  # butterfly: same rate, least fill
    # Two sites joined by slow pairs: trees route inside the sites and beat every star.
    fast, slow = 8e6, 1e6
    sites = [[0.0 if i == j else (fast if (i < 3) == (j < 3) else slow) for j in range(n)] for i in range(n)]
    best = choose_tree_plan(list(range(n)), sites, 8e6, chunk_bytes=1e6)
    from potluck.coordinator.trees import pack_allreduce
    from potluck.coordinator.trees.plan import tree_plan

    stars = tree_plan(list(range(n)), pack_allreduce(sites, one_hop=True).trees)
    t_best = predict_allreduce_time(best, 8e6, sites, chunk_bytes=1e6)
    assert t_best < 0.8 * predict_allreduce_time(stars, 8e6, sites, chunk_bytes=1e6)
