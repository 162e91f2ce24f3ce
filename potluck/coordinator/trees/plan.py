"""What the all-reduce executor consumes, and the time model it is checked against. Pure.

A ``TreePlan`` lists, per tree, its root, every peer's parent and children, and its share of the buffer
(weights normalised to sum 1). Executing it: split the buffer into consecutive per-tree slices by
share; for each tree, stream its slice in chunks: leaves send up, inner peers add their own slice and
forward, the root finishes each chunk and sends it back down the same edges. A ``RingPlan`` lists, per
ring, the peer order and share: the classic reduce-scatter + all-gather around each ring.

``predict_allreduce_time`` models D bytes over a plan for given capacities (bytes/s) and chunk size:
the data split by share must cross every resource (link direction, peer uplink/downlink), so the
transfer time is D / R_eff with R_eff = W / max_resource(load per unit weight / capacity), W the plan's
total weight. chunk_bytes is the data one pipeline step moves across *all* trees: tree T's chunks are
share_T * chunk_bytes, so every tree has the same number of chunks and a light tree is not slower to
fill. Each tree then adds its pipeline fill, (2 * depth - 1) steps of chunk_bytes / R_eff, plus one
latency per hop.

Per-message costs (``message_s``, ``message_byte_s``): every chunk message is handled twice, once by its
sender (encode, frame, write) and once by its receiver (read, deliver, decode), and each handling costs
``message_s + message_byte_s * bytes`` seconds of the handling peer's event loop. Two effects follow:

- pipeline: a peer's stage of a tree handles (children + 1) message ends per chunk and phase (reduce:
  its children's partial sums in, one sum out; broadcast: one in, one per child out), serially with the
  transfer, so every pipeline step of that tree grows by (max children + 1) handlings;
- loop throughput: all trees share the peer's loop (or, with ``shared_loop``, every peer shares one loop,
  as in the in-process benchmark), so the run takes at least the loop's total handling time.

The prediction is the larger of the two: handling overlaps other trees' transfers. Where the loop is about
as busy as the links, the overlap is only partial and the measured time lies above this estimate
(docs/benchmarks.md). The costs depend on the machine and its load (tens of microseconds per message end
on loopback p2pd), so both default to 0, the pure bandwidth + fill + latency model above.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from potluck.coordinator.errors import PackingError
from potluck.coordinator.trees import pack_allreduce
from potluck.coordinator.trees.graph import CapacityInput, NodeCapacityInput, make_network
from potluck.protocol.collective import AllReduceSchedule, TreeSpec

Edge = tuple[Hashable, Hashable]


@dataclass(frozen=True)
class TreeSchedule:
    """One tree: reduce toward root along parent links, broadcast back along children."""

    root: Hashable
    parent: dict[Hashable, Hashable | None]
    children: dict[Hashable, tuple[Hashable, ...]]
    weight: float  # rate of this tree in the packing (bytes/s)
    share: float  # fraction of the buffer this tree carries

    @property
    def depth(self) -> int:
        """Hops from the root to its farthest leaf."""
        depth, frontier = 0, list(self.children[self.root])
        while frontier:
            depth += 1
            frontier = [c for p in frontier for c in self.children[p]]
        return depth

    def edges(self) -> list[Edge]:
        return [(p, c) for c, p in self.parent.items() if p is not None]


@dataclass(frozen=True)
class RingSchedule:
    """One ring: peer i sends to order[(i + 1) % N]."""

    order: tuple[Hashable, ...]
    weight: float
    share: float


@dataclass(frozen=True)
class TreePlan:
    nodes: tuple[Hashable, ...]
    trees: tuple[TreeSchedule, ...]
    rate: float  # sum of tree weights (bytes/s): D bytes take about D / rate plus fill


@dataclass(frozen=True)
class RingPlan:
    nodes: tuple[Hashable, ...]
    rings: tuple[RingSchedule, ...]
    rate: float  # sum of ring weights; D bytes take about 2 (N - 1) / N * D / rate plus fill


def _center(nodes: Sequence[Hashable], adj: dict[Hashable, list[Hashable]]) -> Hashable:
    """The peer of least eccentricity (shallowest root: shortest pipeline fill); first one on ties."""

    def ecc(r: Hashable) -> int:
        dist = {r: 0}
        frontier = [r]
        while frontier:
            nxt = []
            for u in frontier:
                for v in adj[u]:
                    if v not in dist:
                        dist[v] = dist[u] + 1
                        nxt.append(v)
            frontier = nxt
        return max(dist.values())

    return min(nodes, key=ecc)


def schedule_tree(
    nodes: Sequence[Hashable],
    edges: Sequence[Edge],
    weight: float,
    share: float,
    root: Hashable | None = None,
) -> TreeSchedule:
    """Orient an undirected spanning tree from `root` (default: its center). Raises unless spanning."""
    adj: dict[Hashable, list[Hashable]] = {u: [] for u in nodes}
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)
    root = _center(nodes, adj) if root is None else root
    parent: dict[Hashable, Hashable | None] = {root: None}
    order = [root]
    for u in order:  # BFS; `order` grows while iterating
        for v in adj[u]:
            if v not in parent:
                parent[v] = u
                order.append(v)
    if len(parent) != len(nodes) or len(edges) != len(nodes) - 1:
        raise PackingError(f"{len(edges)} edges do not form a spanning tree of {len(nodes)} peers")
    children = {u: tuple(v for v in adj[u] if parent.get(v) == u) for u in nodes}
    return TreeSchedule(root=root, parent=parent, children=children, weight=weight, share=share)


def tree_plan(nodes: Sequence[Hashable], trees: Sequence[tuple[float, Sequence[Edge]]]) -> TreePlan:
    """TreePlan from pack_allreduce's (weight, edges) list; each tree rooted at its center."""
    total = sum(w for w, _ in trees)
    if total <= 0:
        raise PackingError("a tree plan needs positive weights")
    scheds = tuple(schedule_tree(nodes, edges, w, w / total) for w, edges in trees)
    return TreePlan(nodes=tuple(nodes), trees=scheds, rate=total)


def ring_plan(nodes: Sequence[Hashable], rings: Sequence[tuple[float, Sequence[Hashable]]]) -> RingPlan:
    """RingPlan from (weight, peer order) pairs (e.g. pack_rings)."""
    total = sum(w for w, _ in rings)
    if total <= 0:
        raise PackingError("a ring plan needs positive weights")
    for _, order in rings:
        if sorted(map(repr, order)) != sorted(map(repr, nodes)):
            raise PackingError(f"ring {order} does not visit every peer exactly once")
    scheds = tuple(RingSchedule(order=tuple(o), weight=w, share=w / total) for w, o in rings)
    return RingPlan(nodes=tuple(nodes), rings=scheds, rate=total)


def _loads(plan: TreePlan | RingPlan, n: int, index: dict[Hashable, int]) -> tuple[np.ndarray, np.ndarray]:
    """Per unit of plan weight: load on each link direction (n x n) and per-peer up = down load (n,)."""
    link = np.zeros((n, n))
    peer = np.zeros(n)
    if isinstance(plan, TreePlan):
        for t in plan.trees:
            for p, c in t.edges():
                a, b = index[p], index[c]
                link[a, b] += t.weight
                link[b, a] += t.weight
                peer[a] += t.weight
                peer[b] += t.weight
    else:
        for r in plan.rings:
            for i, u in enumerate(r.order):
                a, b = index[u], index[r.order[(i + 1) % len(r.order)]]
                link[a, b] += r.weight
                peer[a] += r.weight
    return link / plan.rate, peer / plan.rate


def effective_rate(
    plan: TreePlan | RingPlan, capacity: CapacityInput, node_capacity: NodeCapacityInput | None = None
) -> float:
    """The rate the plan's weight split achieves on these capacities (W / worst resource utilisation)."""
    net = make_network(capacity, node_capacity)
    index = {u: i for i, u in enumerate(net.nodes)}
    missing = [u for u in plan.nodes if u not in index]
    if missing:
        raise PackingError(f"plan peers {missing[:5]} have no capacities")
    link, peer = _loads(plan, net.n, index)
    with np.errstate(divide="ignore", invalid="ignore"):
        util = np.where(link > 0, link / net.cap, 0.0)
        util_up = np.where(peer > 0, peer / net.up, 0.0)
        util_down = np.where(peer > 0, peer / net.down, 0.0)
    worst = max(float(util.max()), float(util_up.max()), float(util_down.max()))
    return 0.0 if not math.isfinite(worst) or worst <= 0 else 1.0 / worst


def _handling_s(message_s: float, message_byte_s: float, nbytes: float) -> float:
    """Seconds of one event loop to handle one end (send or receive) of an nbytes message."""
    return message_s + message_byte_s * nbytes


def predict_allreduce_time(
    plan: TreePlan | RingPlan,
    nbytes: float,
    capacity: CapacityInput,
    *,
    chunk_bytes: float,
    node_capacity: NodeCapacityInput | None = None,
    latency_s: float = 0.0,
    message_s: float = 0.0,
    message_byte_s: float = 0.0,
    shared_loop: bool = False,
) -> float:
    """Model time (s) of an all-reduce of nbytes over the plan (see the module docstring).

    Trees: nbytes / R + max over trees of [(2 depth_T - 1) * c / R + (n + 2 depth_T - 1) * h_T * m_T]
    + 2 depth * latency, where c = min(chunk, nbytes), n = ceil(nbytes / chunk) chunks (the executor's
    count), m_T = message_s + message_byte_s * (share_T * nbytes / n) the handling of one message end of
    tree T and h_T = 1 + the most children a peer has in T. Tree T streams chunks of share_T * c at
    share_T * R. Rings: the 2(N-1) steps move 2(N-1)/N * nbytes across each link at R, plus one chunk of
    fill, 2(N-1) latencies and 2(N-1) steps of 2 handlings (one segment out, one in).

    The result is at least the busiest event loop's handling time: per chunk, a peer handles
    2 * deg_T(u) message ends of every tree T (a ring peer 2 per step); with ``shared_loop`` all peers'
    handlings add up on one loop. Returns inf when a used link has no capacity.
    """
    if not (message_s >= 0 and message_byte_s >= 0):  # also rejects NaN
        raise ValueError(f"per-message costs must be >= 0, got {message_s}, {message_byte_s}")
    rate = effective_rate(plan, capacity, node_capacity)
    if rate <= 0:
        return math.inf
    costed = message_s > 0 or message_byte_s > 0
    if costed and chunk_bytes <= 0:
        raise ValueError("per-message costs need a positive chunk_bytes (messages = nbytes / chunk)")
    n = len(plan.nodes)
    if isinstance(plan, RingPlan):
        steps = 2 * (n - 1)
        chunk = min(chunk_bytes, nbytes / n)
        base = steps / n * nbytes / rate + chunk / rate + steps * latency_s
        if not costed:
            return base
        # Each step a ring peer sends one segment and receives one: 2 handlings, serial with the step.
        ends = [_handling_s(message_s, message_byte_s, r.share * nbytes / n) for r in plan.rings]
        pipeline = steps * 2 * max(ends)
        per_peer = steps * 2 * sum(ends)  # every peer of every ring runs all its steps on its loop
        loop = per_peer * (n if shared_loop else 1)
        return max(base + pipeline, loop)
    chunk = min(chunk_bytes, nbytes)
    if not costed:
        depth = max(t.depth for t in plan.trees)
        return nbytes / rate + (2 * depth - 1) * chunk / rate + 2 * depth * latency_s
    n_chunks = max(1, math.ceil(nbytes / chunk_bytes))
    index = {u: i for i, u in enumerate(plan.nodes)}
    loop_per_chunk = np.zeros(n)  # seconds of handling per pipeline step, per peer's loop
    per_tree = []
    for t in plan.trees:
        m = _handling_s(message_s, message_byte_s, t.share * nbytes / n_chunks)
        h = 1 + max(len(c) for c in t.children.values())
        steps = n_chunks + 2 * t.depth - 1  # pipeline steps of this tree, each one h handlings longer
        per_tree.append((2 * t.depth - 1) * chunk / rate + steps * h * m)
        for p, c in t.edges():  # each edge: one message per chunk up and one down, 2 ends at either peer
            loop_per_chunk[index[p]] += 2 * m
            loop_per_chunk[index[c]] += 2 * m
    depth = max(t.depth for t in plan.trees)
    pipeline = nbytes / rate + max(per_tree) + 2 * depth * latency_s
    loop = n_chunks * float(loop_per_chunk.sum() if shared_loop else loop_per_chunk.max())
    return max(pipeline, loop)


def to_schedule(plan: TreePlan) -> AllReduceSchedule:
    """The protocol form of a tree plan, as peers execute it (peer ids as strings)."""
    peers = tuple(str(p) for p in plan.nodes)
    trees = tuple(
        TreeSpec(
            root=str(t.root),
            parent={str(c): (None if p is None else str(p)) for c, p in t.parent.items()},
            share=t.share,
        )
        for t in plan.trees
    )
    return AllReduceSchedule(peers, trees)


def choose_tree_plan(
    nodes: Sequence[Hashable],
    capacity: CapacityInput,
    nbytes: float,
    *,
    chunk_bytes: float,
    node_capacity: NodeCapacityInput | None = None,
    max_trees: int | None = None,
) -> TreePlan:
    """The faster, by the time model, of the packed trees and the one-hop (butterfly) stars.

    Packing maximises the rate; on small groups or small buffers a plan of deeper trees can lose more
    to pipeline fill than it gains in rate, and where every peer is linked to every other the stars
    often reach the same rate with depth 1. Scoring both keeps potluck never slower than butterfly by
    its own model. Ties go to the stars (fewer hops, fewer messages).
    """
    candidates = []
    for one_hop in (True, False):
        try:
            packing = pack_allreduce(
                capacity, node_capacity=node_capacity, max_trees=max_trees, one_hop=one_hop
            )
        except PackingError:
            continue  # no star spans the group (a missing link): only trees remain
        plan = tree_plan(nodes, packing.trees)
        t = predict_allreduce_time(
            plan, nbytes, capacity, chunk_bytes=chunk_bytes, node_capacity=node_capacity
        )
        candidates.append((t * (1 + 1e-9) if not one_hop else t, plan))
    if not candidates:
        raise PackingError("no spanning tree over the group's two-way links")
    return min(candidates, key=lambda c: c[0])[1]
