import random

import pytest

from potluck.protocol.collective import (
    AllReduceSchedule,
    TreeSpec,
    one_hop_schedule,
    records_to_schedule,
    restrict,
    schedule_to_records,
    split_elements,
)
from potluck.protocol.errors import ProtocolError
from potluck.protocol.training import TreeRecord

PEERS = ("a", "b", "c", "d", "e")
# a is the root; b and c hang under a; d under b; e under d
TREE = TreeSpec(root="a", parent={"a": None, "b": "a", "c": "a", "d": "b", "e": "d"}, share=1.0)


def test_schedule_validation():
    AllReduceSchedule(PEERS, (TREE,))
    with pytest.raises(ProtocolError, match="span"):
        AllReduceSchedule((*PEERS, "f"), (TREE,))
    with pytest.raises(ProtocolError, match="cycle"):
        AllReduceSchedule(("a", "b", "c"), (TreeSpec("a", {"a": None, "b": "c", "c": "b"}, 1.0),))
    with pytest.raises(ProtocolError, match="positive shares"):
        AllReduceSchedule(PEERS, (TreeSpec("a", TREE.parent, 0.0),))


def test_restrict_reattaches_to_nearest_present_ancestor():
    sub = restrict(AllReduceSchedule(PEERS, (TREE,)), ["a", "c", "e"])
    assert sub.peers == ("a", "c", "e")
    assert sub.trees[0].parent == {"a": None, "c": "a", "e": "a"}  # e's ancestors d, b are gone


def test_restrict_without_root_picks_first_orphan_and_is_order_independent():
    s = AllReduceSchedule(PEERS, (TREE,))
    sub = restrict(s, ["e", "d", "c"])
    assert sub.trees[0].root == "c"
    assert sub.trees[0].parent == {"c": None, "d": "c", "e": "d"}
    assert restrict(s, ["c", "d", "e"]) == sub


def test_split_elements():
    assert split_elements(10, [1, 1, 1]) == [4, 3, 3]
    assert sum(split_elements(1001, [0.3, 0.2, 0.5])) == 1001


# ---- the plan's TreeRecords <-> the executor's schedule -------------------------------------------------


def test_records_round_trip_through_a_schedule():
    records = [
        TreeRecord(share=0.75, parents=[-1, 0, 0, 1, 3]),
        TreeRecord(share=0.25, parents=[2, 2, -1, 2, 2]),
    ]
    sched = records_to_schedule(records, PEERS)
    assert sched.peers == PEERS
    assert sched.trees[0] == TreeSpec("a", {"a": None, "b": "a", "c": "a", "d": "b", "e": "d"}, 0.75)
    assert sched.trees[1] == TreeSpec("c", {"a": "c", "b": "c", "c": None, "d": "c", "e": "c"}, 0.25)
    assert schedule_to_records(sched, PEERS) == records


def test_schedule_round_trips_in_any_replica_order():
    rng = random.Random(5)
    for n in range(1, 9):
        peers = tuple(f"p{i}" for i in range(n))
        trees = []
        for _ in range(3):
            order = list(peers)
            rng.shuffle(order)  # order[0] is the root; each later peer hangs under an earlier one
            parent = {order[0]: None} | {p: order[rng.randrange(i)] for i, p in enumerate(order) if i}
            trees.append(TreeSpec(order[0], parent, rng.uniform(0.05, 1.0)))
        sched = AllReduceSchedule(peers, tuple(trees))
        replicas = list(peers)
        rng.shuffle(replicas)
        records = schedule_to_records(sched, replicas)
        back = records_to_schedule(records, replicas)
        assert back.peers == tuple(replicas)
        assert [t.parent for t in back.trees] == [t.parent for t in sched.trees]
        assert [(t.root, t.share) for t in back.trees] == [(t.root, t.share) for t in sched.trees]


def test_record_shares_are_clamped_into_the_records_range():
    sched = AllReduceSchedule(
        ("a", "b"), (TreeSpec("a", {"a": None, "b": "a"}, 1e-12), TreeSpec("b", {"a": "b", "b": None}, 2.0))
    )
    assert [r.share for r in schedule_to_records(sched, ["a", "b"])] == [1e-9, 1.0]


def test_a_plan_without_trees_runs_one_hop_stars():
    sched = records_to_schedule([], ("a", "b", "c"))
    assert sched == one_hop_schedule(["a", "b", "c"])
    assert [t.root for t in sched.trees] == ["a", "b", "c"]
    for t in sched.trees:
        assert t.share == pytest.approx(1 / 3)
        assert all(t.parent[p] == (None if p == t.root else t.root) for p in sched.peers)
    single = one_hop_schedule(["solo"])
    assert single.trees == (TreeSpec("solo", {"solo": None}, 1.0),)


def test_conversions_refuse_mismatched_groups():
    with pytest.raises(ProtocolError, match="one root"):
        records_to_schedule([TreeRecord(share=1.0, parents=[-1, 0])], PEERS)
    with pytest.raises(ProtocolError, match="outside"):
        records_to_schedule([TreeRecord(share=1.0, parents=[-1, 7])], ("a", "b"))
    with pytest.raises(ProtocolError, match="exactly once"):
        schedule_to_records(AllReduceSchedule(PEERS, (TREE,)), ["a", "b", "c", "d"])
