"""Audits of shard owners without a network: the draw, and the owner's rule as a pure function an
auditor can rerun bit for bit."""

import pytest
import torch

from potluck.net.tags import Direction, Round, Stream, make_tag
from potluck.peer.collectives.robust import aggregate, combine
from potluck.peer.seal import key_of
from potluck.peer.train.checks.audit import select_audits
from potluck.protocol.collective import AllReduceSchedule, TreeSpec

PEERS = ("p0", "p1", "p2", "p3")


def one_hop() -> AllReduceSchedule:
    trees = tuple(
        TreeSpec(root=r, parent={p: (None if p == r else r) for p in PEERS}, share=1.0) for r in PEERS
    )
    return AllReduceSchedule(PEERS, trees)


def keys(step: int) -> set:
    return {
        key_of(make_tag(Round(1, step, 2), Stream.TREE, index=t, chunk=c, direction=Direction.REDUCE))
        for t in range(4)
        for c in range(5)
    }


def test_audits_are_drawn_alike_by_everyone_never_by_the_owner():
    schedule, ks = one_hop(), keys(3)
    seed = bytes(range(32))
    audits = select_audits(seed, ks, schedule, 0.5)
    assert audits == select_audits(seed, set(sorted(ks)), schedule, 0.5)
    assert 0 < len(audits) < len(ks)
    for a in audits:
        assert a.root == PEERS[a.key[1] & 0xFFFFFF] and a.root not in a.auditors and len(set(a.auditors)) == 2
    drawn = sum(len(select_audits(bytes([s]) * 32, ks, schedule, 0.1)) for s in range(200))
    assert 0.08 < drawn / (200 * len(ks)) < 0.12
    assert select_audits(seed, ks, schedule, 0.0) == []
    two = AllReduceSchedule(
        PEERS[:2], tuple(TreeSpec(r, {p: (None if p == r else r) for p in PEERS[:2]}, 1.0) for r in PEERS[:2])
    )
    assert select_audits(seed, ks, two, 1.0) == []  # an owner and one other: nobody to confirm


@pytest.mark.parametrize("rule", ["mean", "trimmed_mean", "centered_clip"])
def test_combine_is_the_rule_with_refusals_and_the_same_bits_twice(rule):
    torch.manual_seed(0)
    stack = torch.randn(5, 64)
    who = [f"p{i}" for i in range(5)]
    out = combine(stack, who, rule, 0.2, average=True)
    assert torch.equal(out.result, combine(stack.clone(), who, rule, 0.2, average=True).result)
    mean, _ = aggregate(rule, stack, 0.2)
    assert torch.allclose(out.result, mean)
    summed = combine(stack, who, rule, 0.2, average=False).result
    assert torch.allclose(summed, out.result * 5)
    bad = stack.clone()
    bad[1, 3] = float("nan")
    refused = combine(bad, who, rule, 0.2, average=True, excluded={"p4"})
    assert refused.refused == ["p1", "p4"]
    assert torch.allclose(refused.result, aggregate(rule, stack[[0, 2, 3]], 0.2)[0])
    with pytest.raises(ValueError):
        combine(bad[:2], who[:2], rule, 0.2, average=True, excluded={"p0"})
