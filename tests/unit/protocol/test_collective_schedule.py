import pytest

from potluck.protocol.collective import AllReduceSchedule, TreeSpec, restrict, split_elements
from potluck.protocol.errors import ProtocolError

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
