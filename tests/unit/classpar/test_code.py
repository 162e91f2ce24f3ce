"""The erasure codes: every K-subset of a systematic Cauchy code decodes, in float64."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from potluck.classpar.code import cauchy, group_parity, replication, systematic_cauchy
from potluck.classpar.errors import CodeError


def test_every_square_submatrix_of_the_cauchy_block_is_invertible() -> None:
    c = cauchy(3, 6)
    for size in (1, 2, 3):
        for rows in itertools.combinations(range(3), size):
            for cols in itertools.combinations(range(6), size):
                assert abs(np.linalg.det(c[np.ix_(rows, cols)])) > 0


@pytest.mark.parametrize(("k", "r"), [(10, 2), (5, 2), (4, 3)])
def test_all_k_subsets_decode_to_1e9(k: int, r: int) -> None:
    code = systematic_cauchy(k, r)
    rng = np.random.default_rng(k * 10 + r)
    scores = rng.random((k, 7, 3))  # units x queries x group width
    replies = code.encode(scores)
    assert np.array_equal(replies[:k], scores)  # systematic
    for rows in itertools.combinations(range(code.n), k):
        order = list(rng.permutation(rows))  # arrival order does not matter
        got = code.decode(order, replies[order])
        assert np.abs(got - scores).max() <= 1e-9 * np.abs(scores).max()


def test_decode_uses_the_first_k_replies_only() -> None:
    code = systematic_cauchy(4, 2)
    scores = np.arange(1.0, 5.0)
    replies = code.encode(scores)
    garbage = replies.copy()
    garbage[5] = 1e9  # a late reply, after four good ones, is never read
    got = code.decode([0, 4, 2, 3, 5], garbage[[0, 4, 2, 3, 5]])
    assert np.allclose(got, scores, rtol=0, atol=1e-12)


def test_too_few_replies_and_local_parities() -> None:
    code = systematic_cauchy(4, 2)
    with pytest.raises(CodeError):
        code.decode([0, 1, 2], np.zeros(3))
    local = group_parity(10, 2)
    assert local.weights() == [1] * 10 + [5, 5]
    assert local.support(10) == [0, 1, 2, 3, 4]
    assert local.decodable([1, 2, 3, 4, 10, 5, 6, 7, 8, 11])  # one missing per group
    assert not local.decodable([2, 3, 4, 10, 11, 5, 6, 7, 8, 9])  # two missing in group 0
    with pytest.raises(CodeError):
        local.decode([2, 3, 4, 10, 11, 5, 6, 7, 8, 9], np.zeros(10))
    assert replication(3).n == 6 and replication(3).weights() == [1] * 6
