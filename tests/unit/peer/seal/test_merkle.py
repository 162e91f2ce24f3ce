"""The Merkle trees behind step seals: every leaf's proof reaches the root, and nothing else does."""

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from potluck.peer.seal import merkle


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=40))
def test_every_leaf_proves_its_place_and_no_other(data: list[bytes]):
    leaves = [merkle.leaf(d) for d in data]
    tree = merkle.levels(leaves)
    root, count = tree[-1][0], len(leaves)
    for i, leaf in enumerate(leaves):
        proof = merkle.proof(tree, i)
        assert len(proof) == merkle.depth(count)
        assert merkle.climb(leaf, i, count, proof) == root
        if count > 1:  # the same proof does not carry a leaf to another place
            other = (i + 1) % count
            assert leaves[other] == leaf or merkle.climb(leaf, other, count, proof) != root
        assert merkle.climb(merkle.leaf(data[i] + b"!"), i, count, proof) != root


def test_an_inner_node_cannot_pass_for_a_leaf():
    leaves = [merkle.leaf(bytes([i])) for i in range(4)]
    tree = merkle.levels(leaves)
    # Unprefixed, the data "left || right" would hash to the inner node above them, and a proof one level
    # shorter would make it a leaf of the same root: a message nobody sent. The prefixes forbid it.
    assert merkle.climb(tree[1][0], 0, 2, [tree[1][1]]) == tree[-1][0]
    assert merkle.leaf(leaves[0] + leaves[1]) != tree[1][0]


@pytest.mark.parametrize("index,count,proof", [(0, 0, []), (2, 2, [b"x" * 32]), (0, 2, []), (0, 2, [b"x"])])
def test_a_malformed_proof_is_refused(index: int, count: int, proof: list[bytes]):
    with pytest.raises(ValueError):
        merkle.climb(merkle.leaf(b"a"), index, count, proof)


def test_depth_bounds_a_tree():
    assert [merkle.depth(n) for n in (1, 2, 3, 4, 5, 1 << 16)] == [0, 1, 2, 2, 3, 16]
    with pytest.raises(ValueError):
        merkle.depth((1 << 16) + 1)
