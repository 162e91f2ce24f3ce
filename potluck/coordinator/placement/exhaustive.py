"""Exact optima of small instances, used as lower bounds and to check the search.

DT-FM objective: vectorised enumeration of every balanced partition.

Used as the lower bound (it is the optimum) where the MILP is slow: up to about 3 million partitions
with at most 5 stages and groups of at most 4 (bottleneck matchings by enumerating permutations) or 2
stages (one matching per partition). Every stage order is tried per partition.

Step objective: plain brute force over shapes, active peers, partitions and stage orders (<= 8 peers).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from potluck.coordinator.placement.costmodel import DeviceSpec, StepJob
from potluck.coordinator.placement.netmodel import NetModel
from potluck.coordinator.placement.objectives import DtfmObjective, StepObjective
from potluck.coordinator.placement.search import pair_matrix

MAX_PARTITIONS = 3_000_000


def partition_count(n: int, s: int, r: int) -> int:
    return math.factorial(n) // (math.factorial(r) ** s * math.factorial(s))


def feasible(n: int, s: int, r: int) -> bool:
    return n == s * r and s <= 5 and (r <= 4 or s <= 2) and partition_count(n, s, r) <= MAX_PARTITIONS


def _subsets(n: int, r: int) -> tuple[np.ndarray, np.ndarray]:
    members = np.array(list(itertools.combinations(range(n), r)), dtype=np.int64)
    masks = (1 << members).sum(axis=1)
    return members, masks


def _partitions(n: int, s: int, masks: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Every partition as S subset indices; each next subset holds the lowest unused device."""
    lowest = members[:, 0]
    by_low = {d: np.nonzero(lowest == d)[0] for d in range(n)}
    parts = by_low[0][:, None]
    used = masks[parts[:, 0]]
    for _ in range(1, s):
        free = ~used & ((1 << n) - 1)
        low = np.log2(free & -free).astype(np.int64)  # lowest unused device of each partial
        new_parts, new_used = [], []
        for d in np.unique(low):
            rows = np.nonzero(low == d)[0]
            cand = by_low[int(d)]
            ok = (used[rows][:, None] & masks[cand][None, :]) == 0
            ri, ci = np.nonzero(ok)
            new_parts.append(np.concatenate([parts[rows[ri]], cand[ci][:, None]], axis=1))
            new_used.append(used[rows[ri]] | masks[cand[ci]])
        parts, used = np.concatenate(new_parts), np.concatenate(new_used)
    return parts


def _pair_weights(
    obj: DtfmObjective, devices: np.ndarray, members: np.ndarray, pairs: np.ndarray
) -> np.ndarray:
    """Boundary cost of every listed pair of groups (`members` rows index into `devices`)."""
    r = members.shape[1]
    out = np.empty(len(pairs))
    if r > 4:
        for k, (a, b) in enumerate(pairs):
            out[k] = obj.boundary(devices[members[a]], devices[members[b]])[0]
        return out
    fwd_all = obj.w_pp[np.ix_(devices, devices)]
    link = obj.link[np.ix_(devices, devices)]
    perms = np.array(list(itertools.permutations(range(r))), dtype=np.int64)
    for lo in range(0, len(pairs), 50_000):
        chunk = pairs[lo : lo + 50_000]
        ma, mb = members[chunk[:, 0]], members[chunk[:, 1]]
        if not obj.directional:
            w = link[ma[:, :, None], mb[:, None, :]]  # (P, r, r)
            out[lo : lo + 50_000] = w[:, np.arange(r)[None, :], perms].max(axis=2).min(axis=1)
            continue
        fwd = fwd_all[ma[:, :, None], mb[:, None, :]]  # fwd[p, i, k]: a_i -> b_k
        bwd = fwd_all.T[ma[:, :, None], mb[:, None, :]]  # bwd[p, i, k]: b_k -> a_i
        rows = np.arange(r)[None, :]
        both = fwd[:, rows, perms].max(axis=2) + bwd[:, rows, perms].max(axis=2)
        out[lo : lo + 50_000] = both.min(axis=1) / 2.0
    return out


def dtfm_optimum(obj: DtfmObjective, devices: np.ndarray) -> float:
    """The exact minimum COMM-COST over all placements of `devices` (requires `feasible`)."""
    s, r, n = obj.n_stages, obj.n_replicas, len(devices)
    if not feasible(n, s, r):
        raise ValueError(f"{n} devices as {s} x {r} is too large to enumerate")
    w_dp = obj.w_dp[np.ix_(devices, devices)]
    members, masks = _subsets(n, r)
    dp = w_dp[members[:, :, None], members[:, None, :]].sum(axis=2).max(axis=1)
    parts = _partitions(n, s, masks, members)
    worst_dp = dp[parts].max(axis=1)
    if s == 1:
        return float(worst_dp.min())
    # Pair weights for every unordered pair of groups that appears together in some partition.
    combos = list(itertools.combinations(range(s), 2))
    a = np.concatenate([parts[:, i] for i, _ in combos])
    b = np.concatenate([parts[:, j] for _, j in combos])
    key = np.minimum(a, b) * len(members) + np.maximum(a, b)
    uniq, inverse = np.unique(key, return_inverse=True)
    listed = np.stack([uniq // len(members), uniq % len(members)], axis=1)
    weights = _pair_weights(obj, devices, members, listed)
    pw = weights[inverse].reshape(len(combos), len(parts))  # pw[c, p]
    slot = {pair: c for c, pair in enumerate(combos)}
    best_path = np.full(len(parts), np.inf)
    for order in itertools.permutations(range(s)):
        if order[0] > order[-1]:
            continue  # a path and its reverse cost the same
        total = np.zeros(len(parts))
        for x, y in itertools.pairwise(order):
            total += pw[slot[(min(x, y), max(x, y))]]
        best_path = np.minimum(best_path, total)
    return float((worst_dp + 2.0 * best_path).min())


def step_optimum(
    state_net: NetModel, devices: Sequence[DeviceSpec], job: StepJob, max_devices: int = 8
) -> tuple[float, tuple[int, int]]:
    """Exact minimum step time over every shape, active subset, partition and stage order.

    Brute force for tiny swarms (<= `max_devices`): the step objective is not a sum of pair terms, so
    nothing is vectorised. Returns (step time, (stages, replicas)) of the optimum.
    """
    n = len(devices)
    if n > max_devices:
        raise ValueError(f"{n} devices are too many to enumerate step-time placements")
    best, shape = math.inf, (0, 0)
    for s in range(1, min(n, job.model.layers) + 1):
        for r in range(1, n // s + 1):
            obj = StepObjective(state_net, devices, job, s, r)
            for active in itertools.combinations(range(n), s * r):
                for groups in balanced_partitions(list(active), r):
                    stats = [obj.group_stat(np.array(g)) for g in groups]
                    pair = pair_matrix(obj, np.array(groups))
                    for order in itertools.permutations(range(s)):
                        edges = np.array([pair[a, b] for a, b in itertools.pairwise(order)])
                        cost = obj.combine([stats[o] for o in order], edges)
                        if cost < best:
                            best, shape = cost, (s, r)
    return best, shape


def balanced_partitions(items: list[int], r: int) -> list[list[list[int]]]:
    """Every partition of `items` into groups of r (groups unordered)."""
    if not items:
        return [[]]
    first, rest = items[0], items[1:]
    out = []
    for mates in itertools.combinations(rest, r - 1):
        left = [x for x in rest if x not in mates]
        out += [[[first, *mates], *tail] for tail in balanced_partitions(left, r)]
    return out
