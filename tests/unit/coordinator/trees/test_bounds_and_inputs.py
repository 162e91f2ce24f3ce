"""Bounds against independent computations; input checking."""

from __future__ import annotations

import itertools
import math

import networkx as nx
import numpy as np
import pytest

from potluck.coordinator.trees import PackingError, exact_strength, pack_allreduce
from potluck.coordinator.trees.bounds import level_set_bound, min_broadcast_bound, set_partitions
from potluck.coordinator.trees.graph import make_network
from potluck.testbed.topologies import dgx1v, lognormal_graph

from .helpers import assert_valid_allreduce


def _bell(n: int) -> int:
    row = [1]
    for _ in range(n - 1):  # Bell triangle
        nxt = [row[-1]]
        for x in row:
            nxt.append(nxt[-1] + x)
        row = nxt
    return row[-1]


@pytest.mark.parametrize("n", range(1, 10))
def test_set_partitions_are_all_distinct_partitions(n: int) -> None:
    labels = set_partitions(n)
    assert len(labels) == _bell(n)
    canon = {tuple(np.unique(r, return_inverse=True)[1]) for r in labels}
    assert len(canon) == len(labels)


def test_strength_of_small_graphs_by_hand() -> None:
    tri = np.array([[0, 3, 3], [3, 0, 3], [3, 3, 0]], float)
    assert exact_strength(make_network(tri))[0] == pytest.approx(4.5)  # 9 / 2 (singletons)
    path = np.array([[0, 2, 0], [2, 0, 5], [0, 5, 0]], float)
    assert exact_strength(make_network(path))[0] == pytest.approx(2.0)  # the weak edge alone
    asym = np.array([[0, 7, 1], [2, 0, 1], [1, 1, 0]], float)  # a tree edge needs both directions
    assert exact_strength(make_network(asym))[0] == pytest.approx(2.0)


def test_level_sets_never_beat_the_exact_strength() -> None:
    for seed in range(5):
        cap = lognormal_graph(7, seed, density=0.6)
        net = make_network(cap)
        exact, _ = exact_strength(net)
        prices = np.random.default_rng(seed).random(len(net.undirected_edges()[0]))
        assert level_set_bound(net, prices)[0] >= exact * (1 - 1e-12)


def test_min_broadcast_bound_matches_networkx() -> None:
    cap = lognormal_graph(9, 3, density=0.5)
    g = nx.DiGraph()
    for u, v in itertools.permutations(range(9), 2):
        if cap[u, v] > 0:
            g.add_edge(u, v, capacity=cap[u, v])
    want = min(nx.maximum_flow_value(g, r, v) for r in range(9) for v in range(9) if r != v)
    got = min_broadcast_bound(cap)
    assert want <= got <= want * (1 + 1e-4)


@pytest.mark.slow  # 1.8 s alone, 11.4 s in a full tier beside a swarm test (2026-11-29)
def test_mwu_alone_is_within_two_eps_of_the_bound_when_run_to_completion() -> None:
    cap = dgx1v()
    p = pack_allreduce(cap, eps=0.05, max_iterations=100_000)
    assert p.stats.mwu_rate >= (1 - 2 * 0.05) * p.upper_bound
    assert p.stats.mwu_trees > len(p.trees)  # and re-optimisation needs far fewer trees


def test_random_graphs_reach_95_percent_with_at_most_2n_trees() -> None:
    for n, seed in [(12, 0), (16, 1)]:
        cap = lognormal_graph(n, seed)
        p = pack_allreduce(cap)
        assert_valid_allreduce(p, cap)
        assert not p.certificate.partition_exact
        assert len(p.trees) <= 2 * n
        assert p.rate >= 0.95 * p.upper_bound


def test_labels_from_a_mapping_are_kept() -> None:
    cap = {"a": {"b": 2.0, "c": 1.0}, "b": {"a": 2.0, "c": 2.0}, "c": {"a": 1.0, "b": 2.0}}
    p = pack_allreduce(cap)
    assert set(p.nodes) == {"a", "b", "c"}
    assert all(u in p.nodes and v in p.nodes for _, edges in p.trees for u, v in edges)
    assert p.rate == pytest.approx(2.5)  # (2 + 1 + 2) / 2


@pytest.mark.parametrize(
    "cap, reason",
    [
        ([[0.0]], "at least 2"),
        ([[0, 1, 0], [1, 0, 0], [0, 0, 0]], "not connected"),
        ([[0, 1], [0, 0]], "not connected"),  # one-way link only: no tree edge can carry both phases
        ([[0, -1], [1, 0]], "non-negative"),
        ([[0, math.nan], [1, 0]], "finite"),
        ([[0, 1, 1]], "square"),
    ],
)
def test_bad_inputs_raise(cap: list[list[float]], reason: str) -> None:
    with pytest.raises(PackingError, match=reason):
        pack_allreduce(cap)


def test_bad_node_capacity_raises() -> None:
    with pytest.raises(PackingError, match="positive"):
        pack_allreduce([[0, 1], [1, 0]], node_capacity=[1.0, 0.0])
    with pytest.raises(PackingError, match="entries"):
        pack_allreduce([[0, 1], [1, 0]], node_capacity=[1.0])


@pytest.mark.parametrize("seed", range(6))
def test_small_random_graphs_reach_the_exact_strength(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 10))
    cap = lognormal_graph(n, seed, density=float(rng.uniform(0.3, 1.0)), symmetric=bool(seed % 2))
    p = pack_allreduce(cap)
    assert_valid_allreduce(p, cap)
    strength, labels = exact_strength(make_network(cap))
    assert p.upper_bound == pytest.approx(strength, rel=1e-9)
    assert p.rate >= 0.99 * strength
    assert len(p.certificate.partition) == len(set(labels.tolist()))


def test_packing_is_deterministic() -> None:
    cap = lognormal_graph(10, 5, density=0.5)  # 16 trees; 12 nodes cost 5x the time for the same check
    node = np.linspace(2.0, 6.0, 10)
    a = pack_allreduce(cap, node_capacity=node)
    b = pack_allreduce(cap, node_capacity=node)
    assert a.trees == b.trees and a.rate == b.rate and a.certificate == b.certificate
