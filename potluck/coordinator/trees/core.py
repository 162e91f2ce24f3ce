"""Fractional packing machinery shared by the tree, star and ring packers.

A *column* is one candidate structure (a spanning tree, a star, a ring) described by its usage vector:
the load it puts on every resource (link direction, peer uplink, peer downlink) per unit of weight,
divided by that resource's capacity, so every resource has capacity 1. The packers maximise the sum
of column weights subject to sum_T w_T * usage_T <= 1 in three steps:

1. ``mwu``: Garg-Koenemann multiplicative weights. Prices on resources grow with their use; each step
   asks an oracle for the cheapest column and routes its bottleneck amount through it. Every step also
   yields a dual (upper) bound: sum(prices) / cost of the cheapest column.
2. ``colgen``: LP re-optimisation over the columns found (scipy HiGHS), then column generation: the LP
   duals are prices, the oracle's cheapest column enters when it has positive reduced cost. When no
   column improves, the LP is optimal over *all* columns and the dual bound equals the LP value.
3. ``fewest``: keep few columns (each one is a separate chunk stream in the executor). Two candidate
   sets, the better one wins: (a) the smallest prefix of the LP support, heaviest first, that keeps
   (1 - tol) of the LP value (improved by a node-limited MILP when the support is small); (b) ``greedy``
   widest structures: each takes the oracle's cheapest column under prices 1 / residual capacity (for
   trees without peer caps: the maximum-bottleneck spanning tree) and its whole bottleneck, so every
   step saturates a resource. Both are capped at ``max_count`` columns and LP re-optimised.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

logger = logging.getLogger(__name__)

# Price of a saturated resource in the widest-structure steps: large enough that no column crossing
# it is cheapest while another exists, finite so that sums stay ordered.
_SATURATED_PRICE = 1e30
# Relative tolerance under which LP values are "equal" (HiGHS's own feasibility tolerance is ~1e-7).
_REL_EPS = 1e-9
# Branch-and-bound nodes the MILP may use when minimising the tree count: bounded work, deterministic.
_MILP_NODE_LIMIT = 500


@dataclass(frozen=True)
class Column:
    """One candidate structure: its key (sorted edge or arc ids) and its normalised usage vector."""

    key: tuple[int, ...]
    usage: np.ndarray

    @property
    def bottleneck(self) -> float:
        """The weight this column could carry alone (1 / its most loaded resource)."""
        return 1.0 / float(self.usage.max())


Oracle = Callable[[np.ndarray], Column]


@dataclass(frozen=True)
class Solution:
    """Columns with weights (feasible: sum_T w_T usage_T <= 1) and the best dual bound seen."""

    columns: tuple[Column, ...]
    weights: np.ndarray
    dual_bound: float
    iterations: int
    prices: np.ndarray  # the last resource prices (LP duals after colgen), for partition certificates

    @property
    def value(self) -> float:
        return float(self.weights.sum())


def _scale_to_feasible(columns: list[Column], weights: np.ndarray) -> np.ndarray:
    load = np.stack([c.usage for c in columns], axis=1) @ weights
    peak = float(load.max())
    return weights / peak if peak > 0 else weights


def mwu(oracle: Oracle, n_resources: int, *, eps: float, max_iterations: int) -> Solution:
    """Garg-Koenemann fractional packing; stops at D(y) >= 1 or after max_iterations oracle calls.

    The flow is made feasible by dividing by the peak load (never worse than the textbook log scaling,
    and valid when the iteration cap stops it early).
    """
    delta = (1.0 + eps) * ((1.0 + eps) * n_resources) ** (-1.0 / eps)
    prices = np.full(n_resources, delta)
    index: dict[Hashable, int] = {}
    columns: list[Column] = []
    flow: list[float] = []
    bound = math.inf
    iterations = 0
    while iterations < max_iterations and prices.sum() < 1.0:
        col = oracle(prices)
        iterations += 1
        cost = float(col.usage @ prices)
        bound = min(bound, float(prices.sum()) / cost)
        amount = col.bottleneck
        if col.key not in index:
            index[col.key] = len(columns)
            columns.append(col)
            flow.append(0.0)
        flow[index[col.key]] += amount
        prices *= 1.0 + eps * amount * col.usage
    weights = _scale_to_feasible(columns, np.array(flow))
    logger.debug(
        "mwu: %d iterations, %d columns, value %.6g, bound %.6g",
        iterations,
        len(columns),
        weights.sum(),
        bound,
    )
    return Solution(tuple(columns), weights, bound, iterations, prices)


def solve_lp(columns: list[Column]) -> tuple[np.ndarray, np.ndarray]:
    """max sum(w) s.t. usage @ w <= 1, w >= 0; returns (weights, dual prices >= 0)."""
    a_ub = np.stack([c.usage for c in columns], axis=1)
    res = linprog(
        -np.ones(len(columns)), A_ub=a_ub, b_ub=np.ones(a_ub.shape[0]), bounds=(0, None), method="highs-ipm"
    )  # ~3x faster than simplex at N = 64; crossover
    # runs by default, so the solution is basic (few non-zero columns) and the duals are exact.
    if res.status != 0:  # cannot happen for a bounded, feasible (w = 0) packing LP; fail loudly
        raise RuntimeError(f"HiGHS failed on the packing LP: {res.message}")
    return np.maximum(res.x, 0.0), np.maximum(-res.ineqlin.marginals, 0.0)


# Columns whose reduced cost (price - 1) exceeds this are dropped from the LP: they are far from
# entering, and a small LP is what keeps a round cheap (~0.15 s at N = 64 with ~500 columns).
_DROP_REDUCED_COST = 0.05


def colgen(
    oracle: Oracle,
    start: Solution,
    *,
    max_rounds: int,
    gap: float,
    seeds: list[Column] | None = None,
    extra_bound: Callable[[np.ndarray], float] | None = None,
) -> Solution:
    """LP re-optimisation over start's columns (and seeds), then column generation until the gap closes.

    Each round adds two columns: the cheapest under the LP duals (the classic pricing step, which also
    gives the dual bound) and the cheapest under 1 / residual capacity of the current LP solution
    (a widest-tree step that raises the primal directly). extra_bound(prices) may supply another upper
    bound from the duals (a partition bound); it only serves to stop early, never enters dual_bound.
    """
    columns = list(start.columns)
    keys = {c.key for c in columns}
    for col in seeds or []:
        if col.key not in keys:
            keys.add(col.key)
            columns.append(col)
    bound = start.dual_bound
    weights, prices = start.weights, start.prices
    rounds = 0
    for rounds in range(1, max_rounds + 1):  # noqa: B007 - rounds is reported after the loop
        weights, prices = solve_lp(columns)
        value = float(weights.sum())
        col = oracle(prices)
        cost = float(col.usage @ prices)
        if cost > 0:
            bound = min(bound, float(prices.sum()) / cost)
        other = extra_bound(prices) if extra_bound is not None else math.inf
        if cost >= 1.0 - _REL_EPS or value >= min(bound, other) * (1.0 - gap) or col.key in keys:
            break
        usage = np.stack([c.usage for c in columns], axis=1)
        reduced = prices @ usage - 1.0
        keep = (weights > 0) | (reduced <= _DROP_REDUCED_COST)
        columns = [c for c, k in zip(columns, keep, strict=True) if k]
        residual = np.maximum(1.0 - usage @ weights, 0.0)
        alive = residual > _REL_EPS
        widest = oracle(np.where(alive, 1.0 / np.where(alive, residual, 1.0), _SATURATED_PRICE))
        for new in (col, widest):
            if new.key not in {c.key for c in columns}:
                keys.add(new.key)
                columns.append(new)
    else:  # out of rounds: the columns changed after the last LP
        weights, prices = solve_lp(columns)
    bound = max(bound, float(weights.sum()))  # rounding in the duals must not put the bound below a primal
    logger.debug(
        "colgen: %d rounds, %d columns, value %.6g, bound %.6g", rounds, len(columns), weights.sum(), bound
    )
    return Solution(tuple(columns), weights, bound, start.iterations + rounds, prices)


def _prefix_value(columns: list[Column], k: int) -> tuple[float, np.ndarray]:
    weights, _ = solve_lp(columns[:k])
    return float(weights.sum()), weights


def _milp_fewest(columns: list[Column], target: float) -> list[int] | None:
    """Indices of the fewest columns reaching `target` (node-limited MILP); None if it found none."""
    k = len(columns)
    usage = np.stack([c.usage for c in columns], axis=1)
    caps = np.array([c.bottleneck for c in columns])
    # Variables [w_1..w_k, z_1..z_k]: minimise sum z; w_T <= cap_T z_T ties a weight to its indicator.
    cost = np.concatenate([np.zeros(k), np.ones(k)])
    rows = [
        LinearConstraint(np.hstack([usage, np.zeros_like(usage)]), -np.inf, 1.0),
        LinearConstraint(np.concatenate([np.ones(k), np.zeros(k)])[None, :], target, np.inf),
        LinearConstraint(np.hstack([np.eye(k), -np.diag(caps)]), -np.inf, 0.0),
    ]
    res = milp(
        cost,
        constraints=rows,
        integrality=np.concatenate([np.zeros(k), np.ones(k)]),
        bounds=Bounds(np.zeros(2 * k), np.concatenate([caps, np.ones(k)])),
        # presolve off: HiGHS 1.x prints debug lines to stdout from its presolved-MIP path
        options={"node_limit": _MILP_NODE_LIMIT, "presolve": False},
    )
    if res.x is None:
        return None
    return [i for i in range(k) if res.x[k + i] > 0.5]


def greedy(oracle: Oracle, n_resources: int, *, count: int) -> list[Column]:
    """Up to `count` columns, each the cheapest under prices 1 / residual, taking its whole bottleneck."""
    residual = np.ones(n_resources)
    columns: list[Column] = []
    keys: set[Hashable] = set()
    for _ in range(count):
        alive = residual > _REL_EPS
        prices = np.where(alive, 1.0 / np.where(alive, residual, 1.0), _SATURATED_PRICE)
        col = oracle(prices)
        used = col.usage > 0
        if not alive[used].all() or col.key in keys:
            break  # every column now crosses a saturated resource
        amount = float((residual[used] / col.usage[used]).min())
        residual = np.maximum(residual - amount * col.usage, 0.0)
        residual[used & (residual < _REL_EPS)] = 0.0
        columns.append(col)
        keys.add(col.key)
    return columns


# Above this many support columns the count-minimising MILP is skipped (its cost grows fast).
_MILP_MAX_COLUMNS = 64


def swap_improve(oracle: Oracle, chosen: list[Column], *, rounds: int) -> tuple[list[Column], np.ndarray]:
    """Local search at a fixed column count: bring in the cheapest column under the duals or the widest
    under the residual, drop the lightest one, keep the swap when the LP value rises."""
    weights, prices = solve_lp(chosen)
    for _ in range(rounds):
        usage = np.stack([c.usage for c in chosen], axis=1)
        residual = np.maximum(1.0 - usage @ weights, 0.0)
        alive = residual > _REL_EPS
        candidates = [
            oracle(prices),
            oracle(np.where(alive, 1.0 / np.where(alive, residual, 1.0), _SATURATED_PRICE)),
        ]
        keys = {c.key for c in chosen}
        improved = False
        for new in candidates:
            if new.key in keys:
                continue
            grown = [*chosen, new]
            grown_w, _ = solve_lp(grown)
            drop = int(np.argmin(grown_w))
            trial = grown[:drop] + grown[drop + 1 :]
            trial_w, trial_p = solve_lp(trial)
            if trial_w.sum() > weights.sum() * (1 + _REL_EPS):
                chosen, weights, prices, improved = trial, trial_w, trial_p, True
                break
        if not improved:
            break
    return chosen, weights


# Swap rounds per allowed column in ``fewest`` (each costs up to four small LPs).
_SWAP_ROUNDS_PER_COLUMN = 1


def fewest(
    solution: Solution,
    *,
    tol: float,
    max_count: int,
    extra: list[Column] | None = None,
    oracle: Oracle | None = None,
) -> Solution:
    """Few columns keeping >= (1 - tol) of the LP value when max_count allows it, else the best found.

    extra: another candidate set (e.g. from ``greedy``), used instead when its LP value is higher.
    """
    order = np.argsort(-solution.weights, kind="stable")
    support = [solution.columns[i] for i in order if solution.weights[i] > _REL_EPS * solution.value]
    target = (1.0 - tol) * solution.value
    lo, hi = 1, len(support)  # the smallest prefix reaching the target: values grow with the prefix
    while lo < hi:
        mid = (lo + hi) // 2
        if _prefix_value(support, mid)[0] >= target:
            hi = mid
        else:
            lo = mid + 1
    chosen = support[:lo]
    if lo > 2 and len(support) <= _MILP_MAX_COLUMNS:
        picked = _milp_fewest(support, target)
        if picked is not None and len(picked) < lo:
            chosen = [support[i] for i in picked]
    chosen = chosen[:max_count]
    value, weights = _prefix_value(chosen, len(chosen))
    if extra:
        other = extra[:max_count]
        other_value, other_weights = _prefix_value(other, len(other))
        better = other_value > value * (1 + _REL_EPS) or (other_value >= target and len(other) < len(chosen))
        if better:
            chosen, weights, value = other, other_weights, other_value
    if oracle is not None and value < target:
        chosen, weights = swap_improve(oracle, chosen, rounds=_SWAP_ROUNDS_PER_COLUMN * max_count)
    keep = weights > _REL_EPS * max(float(weights.sum()), _REL_EPS)
    kept = tuple(c for c, k in zip(chosen, keep, strict=True) if k)
    return Solution(kept, weights[keep], solution.dual_bound, solution.iterations, solution.prices)
