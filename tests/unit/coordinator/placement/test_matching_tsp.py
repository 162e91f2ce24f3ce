"""Bottleneck matching and open-path TSP against brute force on small random instances."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from potluck.coordinator.placement.matching import bottleneck_matching
from potluck.coordinator.placement.tsp import held_karp_path, heuristic_path, open_path, path_cost


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_bottleneck_matching_is_optimal(n: int) -> None:
    rng = np.random.default_rng(n)
    for _ in range(20):
        w = rng.integers(0, 6, size=(n, n)).astype(float)
        value, match = bottleneck_matching(w)
        brute = min(max(w[i, p[i]] for i in range(n)) for p in itertools.permutations(range(n)))
        assert value == brute
        assert sorted(match) == list(range(n))
        assert max(w[i, match[i]] for i in range(n)) == value


def test_bottleneck_matching_large_uses_threshold_search() -> None:
    rng = np.random.default_rng(0)
    w = rng.random((40, 40))
    value, match = bottleneck_matching(w)
    assert sorted(match) == list(range(40))
    assert max(w[i, match[i]] for i in range(40)) == pytest.approx(value)
    # No perfect matching exists strictly below the answer.
    below = w < value
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_bipartite_matching

    assert (maximum_bipartite_matching(csr_matrix(below), perm_type="column") < 0).any()


@pytest.mark.parametrize("n", [2, 4, 6, 7])
def test_held_karp_matches_brute_force(n: int) -> None:
    rng = np.random.default_rng(10 + n)
    w = rng.random((n, n))
    w = w + w.T
    cost, order = held_karp_path(w)
    brute = min(path_cost(w, list(p)) for p in itertools.permutations(range(n)))
    assert cost == pytest.approx(brute)
    assert sorted(order) == list(range(n))
    assert path_cost(w, order) == pytest.approx(cost)


def test_heuristic_path_is_a_valid_path_close_to_exact() -> None:
    rng = np.random.default_rng(3)
    pts = rng.random((12, 2))
    w = np.linalg.norm(pts[:, None] - pts[None], axis=2)
    exact, _ = held_karp_path(w)
    approx, order = heuristic_path(w)
    assert sorted(order) == list(range(12))
    assert exact <= approx + 1e-12
    assert approx <= 1.10 * exact
    big = rng.random((20, 20))
    _cost, order = open_path(big + big.T)
    assert sorted(order) == list(range(20))
