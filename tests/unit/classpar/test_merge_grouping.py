"""Merging group scores back to class order, and even k-means."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from potluck.classpar.errors import GroupingError, MergeError
from potluck.classpar.grouping import class_order, contiguous_groups, even_kmeans, group_sizes
from potluck.classpar.merge import merge_outputs, merge_scores


def test_merge_matches_a_hand_computed_example() -> None:
    groups = [[1, 3], [0, 2]]
    # group [1, 3]: softmax over (other, class 1, class 3); group [0, 2]: (other, class 0, class 2)
    a = torch.tensor([[0.2, 0.5, 0.3], [0.7, 0.1, 0.2]])
    b = torch.tensor([[0.6, 0.3, 0.1], [0.1, 0.05, 0.85]])
    merged = merge_outputs([a, b], groups)
    # by hand: class 0 <- b[:,1], class 1 <- a[:,1], class 2 <- b[:,2], class 3 <- a[:,2]
    want = torch.tensor([[0.3, 0.5, 0.1, 0.3], [0.05, 0.1, 0.85, 0.2]])
    assert torch.equal(merged, want)
    assert merged.argmax(dim=1).tolist() == [1, 2]


def test_merge_refuses_mismatched_blocks() -> None:
    with pytest.raises(MergeError):
        merge_scores([torch.zeros(1, 2)], [[0, 1], [2, 3]])
    with pytest.raises(MergeError):
        merge_scores([torch.zeros(1, 3), torch.zeros(1, 2)], [[0, 1], [2, 3]])


def test_merge_inverts_any_grouping() -> None:
    rng = np.random.default_rng(3)
    full = torch.from_numpy(rng.random((5, 10)))
    groups = [[4, 9], [0, 7], [1, 2], [3, 8], [5, 6]]
    blocks = [full[:, g] for g in groups]
    assert torch.equal(merge_scores(blocks, groups), full)
    assert sorted(class_order(groups)) == list(range(10))


@pytest.mark.parametrize("num_groups", [1, 2, 5, 10])
def test_even_kmeans_returns_equal_groups_covering_every_class(num_groups: int) -> None:
    rng = np.random.default_rng(0)
    points = rng.normal(size=(10, 6))
    groups = even_kmeans(points, num_groups, seed=1)
    assert [len(g) for g in groups] == [10 // num_groups] * num_groups
    assert sorted(c for g in groups for c in g) == list(range(10))
    assert groups == even_kmeans(points, num_groups, seed=1)


def _inertia(points: np.ndarray, groups: list[list[int]]) -> float:
    return float(sum(((points[g] - points[g].mean(axis=0)) ** 2).sum() for g in groups))


def test_even_kmeans_finds_the_best_equal_split_of_unequal_clusters() -> None:
    # clusters of 3, 3 and 4 points far apart: no equal split follows them, so compare with brute force
    centres = np.array([[0.0, 0.0], [100.0, 0.0], [0.0, 100.0]])
    labels = [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    points = centres[labels] + np.random.default_rng(1).normal(scale=0.1, size=(10, 2))
    groups = even_kmeans(points, 2, seed=0)
    assert [len(g) for g in groups] == [5, 5]
    best = min(
        _inertia(points, [list(a), [c for c in range(10) if c not in a]])
        for a in itertools.combinations(range(10), 5)
    )
    assert _inertia(points, groups) == pytest.approx(best)
    tight = even_kmeans(centres[[0, 1, 2, 0, 1, 2]], 3, seed=0)
    assert tight == [[0, 3], [1, 4], [2, 5]]


def test_group_sizes_and_contiguous_groups() -> None:
    assert group_sizes(10, 3) == [4, 3, 3]
    assert contiguous_groups(10, 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    with pytest.raises(GroupingError):
        group_sizes(3, 4)
