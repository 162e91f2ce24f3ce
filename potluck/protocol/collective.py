"""All-reduce schedules as the coordinator sends them and the peers execute them (pure data).

A schedule names the group's peers and, per spanning tree, its root, every peer's parent and the tree's
share of the buffer. The coordinator builds it from a tree packing; each peer runs its part of it.

In a signed plan the same trees travel as ``TreeRecord``s, peers named by their replica index. This
module is the one place that converts between the two (``schedule_to_records``, ``records_to_schedule``)
and that says what a stage without trees runs (``one_hop_schedule``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from potluck.protocol.errors import ProtocolError
from potluck.protocol.training import TreeRecord

MIN_RECORD_SHARE = 1e-9  # TreeRecord shares are in (0, 1]: a packer's tiny positive share stays positive


@dataclass(frozen=True)
class TreeSpec:
    root: str
    parent: dict[str, str | None]  # every peer of the group; the root maps to None
    share: float  # fraction of the buffer this tree carries

    def children(self, peer: str, order: Sequence[str]) -> list[str]:
        """``peer``'s children in the group's order: a fixed order makes the sums bit-reproducible."""
        return [p for p in order if self.parent.get(p) == peer]


@dataclass(frozen=True)
class AllReduceSchedule:
    peers: tuple[str, ...]
    trees: tuple[TreeSpec, ...]

    def __post_init__(self) -> None:
        group = set(self.peers)
        if len(group) != len(self.peers) or not self.peers:
            raise ProtocolError("an all-reduce group needs distinct peers")
        if not self.trees or any(t.share <= 0 for t in self.trees):
            raise ProtocolError("an all-reduce schedule needs trees with positive shares")
        for t in self.trees:
            if set(t.parent) != group or t.parent.get(t.root, "") is not None:
                raise ProtocolError("every tree must span the group and have its root's parent None")
            for peer in self.peers:  # every peer reaches the root without a cycle
                seen: set[str] = set()
                cur: str | None = peer
                while cur is not None:
                    if cur in seen:
                        raise ProtocolError(f"tree rooted at {t.root} has a cycle through {cur}")
                    seen.add(cur)
                    cur = t.parent[cur]

    @property
    def shares(self) -> list[float]:
        return [t.share for t in self.trees]


def split_elements(n_elements: int, shares: Sequence[float]) -> list[int]:
    """Integer sizes proportional to ``shares`` summing to ``n_elements`` (largest remainder; ties to the
    earlier part), so every peer cuts a buffer identically."""
    raw = np.asarray(shares, dtype=np.float64) * n_elements / float(sum(shares))
    sizes = np.floor(raw).astype(np.int64)
    rest = n_elements - int(sizes.sum())
    order = np.argsort(-(raw - sizes), kind="stable")
    sizes[order[:rest]] += 1
    return [int(s) for s in sizes]


def restrict(schedule: AllReduceSchedule, members: Sequence[str]) -> AllReduceSchedule:
    """The schedule over a subset of its peers (those who contribute this round). Deterministic, so every
    member derives the same trees: a peer whose parent is absent hangs under its nearest present
    ancestor; if the root is absent, the first orphan in group order becomes the root and the other
    orphans hang under it."""
    keep = set(members)
    peers = tuple(p for p in schedule.peers if p in keep)
    if not peers:
        raise ProtocolError("an all-reduce needs at least one member")
    trees = []
    for tree in schedule.trees:

        def present_ancestor(p: str | None, tree: TreeSpec = tree) -> str | None:
            while p is not None and p not in keep:
                p = tree.parent[p]
            return p

        parent = {p: present_ancestor(tree.parent[p]) for p in peers}
        orphans = [p for p in peers if parent[p] is None]
        root = orphans[0]
        for p in orphans[1:]:
            parent[p] = root
        trees.append(TreeSpec(root=root, parent=parent, share=tree.share))
    return AllReduceSchedule(peers, tuple(trees))


def one_hop_schedule(peers: Sequence[str]) -> AllReduceSchedule:
    """The default for a stage whose plan has no trees: one star per peer, rooted at it, equal shares
    (replica k reduces and broadcasts share k; every message travels one hop)."""
    group = tuple(peers)
    trees = (
        TreeSpec(root=r, parent={p: (None if p == r else r) for p in group}, share=1.0 / len(group))
        for r in group
    )
    return AllReduceSchedule(group, tuple(trees))


def records_to_schedule(records: Sequence[TreeRecord], peers: Sequence[str]) -> AllReduceSchedule:
    """The schedule of a plan's trees, replica i being ``peers[i]``; ``one_hop_schedule`` when empty."""
    group = tuple(peers)
    if not records:
        return one_hop_schedule(group)
    specs = []
    for t in records:
        roots = t.parents.count(-1)
        if len(t.parents) != len(group) or roots != 1:
            raise ProtocolError(
                f"a tree needs one parent per replica and one root: {len(t.parents)} parents and {roots} "
                f"roots for {len(group)} replicas"
            )
        if any(not -1 <= p < len(group) for p in t.parents):
            raise ProtocolError(f"tree parents {t.parents} name a replica outside 0..{len(group) - 1}")
        parent = {p: (None if i < 0 else group[i]) for p, i in zip(group, t.parents, strict=True)}
        specs.append(TreeSpec(root=group[t.parents.index(-1)], parent=parent, share=t.share))
    return AllReduceSchedule(group, tuple(specs))


def schedule_to_records(schedule: AllReduceSchedule, order: Sequence[str]) -> list[TreeRecord]:
    """The plan form of ``schedule``: replica i is ``order[i]`` (a permutation of the schedule's peers).

    Shares are clamped into a record's (0, 1]."""
    index = {p: i for i, p in enumerate(order)}
    if len(index) != len(order) or set(index) != set(schedule.peers):
        raise ProtocolError("the replica order must name each peer of the schedule exactly once")
    out = []
    for t in schedule.trees:
        parents = [-1 if (par := t.parent[p]) is None else index[par] for p in order]
        out.append(TreeRecord(share=min(1.0, max(t.share, MIN_RECORD_SHARE)), parents=parents))
    return out
