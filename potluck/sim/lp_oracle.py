"""An independent formulation of the LP policies, solved by exhaustive vertex enumeration (small only).

Acceptance G1 checks ``policies.solve`` against this. Nothing is shared with ``policies.py`` but the
input data: the constraints are written out again, entry by entry, from the definitions in Gavel's
paper; the equal share is recomputed; and instead of a solver, every basic solution (n of the
constraints tight, n = the number of variables) is solved for with numpy, the feasible ones kept and the
best objective taken. An LP optimum that exists lies at such a vertex, so this is exact, and affordable
up to about 12 variables and 25 constraints.
"""

from __future__ import annotations

import itertools
import logging

import numpy as np

from potluck.coordinator.allocation.errors import AllocationError
from potluck.coordinator.allocation.problem import Array, Problem

logger = logging.getLogger(__name__)

MAX_BASES = 3_000_000  # combinations of tight constraints we are willing to try
CHUNK = 20_000
TOL = 1e-9


def reference_objective(problem: Problem, policy: str) -> float:
    """The optimum of ``policy`` ("max_min", "makespan" or "max_throughput") by vertex enumeration."""
    m, k = problem.m, problem.k
    rows = [(i,) for i in range(m)] + list(problem.pairs)
    # variables: x[r, j] for the (r, j) that may be positive, then t for max_min and makespan
    var = [
        (r, j)
        for r, jobs in enumerate(rows)
        for j in range(k)
        if problem.scale[jobs[0]] <= problem.capacity[j] and (len(jobs) == 1 or problem.shareable[j])
    ]

    def rate(job: int, r: int, j: int) -> float:
        jobs = rows[r]
        if job not in jobs:
            return 0.0
        if len(jobs) == 1:
            return float(problem.rates[job, j])
        return float(problem.pair_rates[r - m, j, jobs.index(job)])

    # equal share: every job the same fraction of every class it can use, in proportion to class size
    usable = [[problem.scale[i] <= problem.capacity[j] for j in range(k)] for i in range(m)]
    fit = min(1.0, problem.capacity.sum() / problem.scale.sum())
    eq = []
    for i in range(m):
        size = sum(problem.capacity[j] for j in range(k) if usable[i][j])
        eq.append(
            sum(problem.rates[i, j] * problem.capacity[j] / size * fit for j in range(k) if usable[i][j])
            if size
            else 0.0
        )
    live = [i for i in range(m) if eq[i] > 0]
    with_t = policy in ("max_min", "makespan")
    n = len(var) + int(with_t)
    g: list[list[float]] = []
    h: list[float] = []
    for v in range(n):  # every variable >= 0
        g.append([-1.0 if w == v else 0.0 for w in range(n)])
        h.append(0.0)
    for i in range(m):  # a job's time adds up to at most 1
        g.append([1.0 if i in rows[r] else 0.0 for r, _ in var] + [0.0] * with_t)
        h.append(1.0)
    for j in range(k):  # a class lends at most its workers
        g.append([float(problem.scale[rows[r][0]]) if c == j else 0.0 for r, c in var] + [0.0] * with_t)
        h.append(float(problem.capacity[j]))
    objective = np.zeros(n)
    for i in live:
        gains = [rate(i, r, j) for r, j in var]
        if policy == "max_min":  # t <= rho_i / w_i
            g.append([-x / (eq[i] * problem.weights[i]) for x in gains] + [1.0])
            h.append(0.0)
        elif policy == "makespan":  # t <= throughput_i / remaining_i
            g.append([-x / problem.remaining[i] for x in gains] + [1.0])
            h.append(0.0)
        else:
            objective[: len(var)] += np.array(gains) * problem.weights[i] / eq[i]
    if with_t:
        objective[-1] = 1.0
    if not live:
        return 0.0
    return _enumerate(np.array(g), np.array(h), objective)


def _enumerate(g: Array, h: Array, c: Array) -> float:
    n = g.shape[1]
    total = _comb(len(h), n)
    if total > MAX_BASES:
        raise AllocationError(f"{total} bases: too large an instance for vertex enumeration")
    best = -np.inf
    combos = itertools.combinations(range(len(h)), n)
    while True:
        chunk = np.array(list(itertools.islice(combos, CHUNK)), dtype=np.int64)
        if not len(chunk):
            break
        a, b = g[chunk], h[chunk]
        ok = np.abs(np.linalg.det(a)) > 1e-12
        if not ok.any():
            continue
        z = np.linalg.solve(a[ok], b[ok][..., None])[..., 0]
        feasible = (z @ g.T <= h + 1e-7 * (1.0 + np.abs(h))).all(axis=1)
        if feasible.any():
            best = max(best, float((z[feasible] @ c).max()))
    return best


def _comb(a: int, b: int) -> int:
    out = 1
    for i in range(b):
        out = out * (a - i) // (i + 1)
    return out
