"""Allocation policies as linear programs (scipy's HiGHS), plus FIFO and the heterogeneity-blind baseline.

Normalised throughput ``rho[m] = throughput[m](X) / equal_throughput[m]`` puts every job in one unit:
1.0 is what the job would get from an equal, heterogeneity-blind split (``problem.equal_share``).
Every policy reports an ``objective`` where higher is better:

- ``max_min``: weighted max-min fairness, ``max min_m rho[m] / weight[m]``; objective = that minimum.
  LAS (least attained service) is this policy with weights = 1 / attained service (``rounds.py``).
- ``makespan``: ``max u`` with ``throughput[m] >= remaining[m] * u``; the makespan is ``1 / u`` seconds,
  and the objective is ``u`` (one LP, where Gavel bisects on the makespan).
- ``max_throughput``: ``max sum_m weight[m] * rho[m]``.
- ``fifo``: jobs in arrival order each take their fastest free classes (a greedy that is exact for one
  job at a time); objective = ``sum rho``.

After the first LP, ``max_min`` and ``makespan`` run a second one that keeps their optimum and spends the
rest of the workers on ``sum rho`` (a max-min optimum may leave workers idle); ``max_min`` may first
water-fill (raise the jobs that are not the bottleneck, found by their zero duals) a few levels.
The agnostic variant solves on ``problem.agnostic``, spreads each job's time over the classes (it cannot
tell them apart) and is scored on the true rates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.optimize import OptimizeResult, linprog
from scipy.sparse import csr_matrix

from potluck.coordinator.allocation.errors import SolverError
from potluck.coordinator.allocation.problem import Array, Problem, agnostic, equal_throughput

logger = logging.getLogger(__name__)

PolicyName = Literal["max_min", "makespan", "max_throughput", "fifo"]
POLICIES: tuple[PolicyName, ...] = ("max_min", "makespan", "max_throughput", "fifo")
DENSE_MAX = 200_000  # constraint-matrix entries up to which HiGHS gets a dense matrix
KEEP = 1e-7  # relative slack the second LP gives the first one's optimum (HiGHS's own tolerance)


@dataclass(frozen=True)
class PolicyResult:
    """X (rows x classes, time fractions) and what it gives, scored on the problem's true rates."""

    x: Array
    objective: float  # higher is better (see the module docstring)
    throughput: Array  # (m,) steps/s per job
    reason: str


def solve(problem: Problem, policy: PolicyName, *, aware: bool = True, water_fill: int = 0) -> PolicyResult:
    """The allocation ``policy`` picks; ``aware=False`` solves blind to classes (Gavel's baseline)."""
    seen = problem if aware else agnostic(problem)
    if problem.m == 0 or problem.k == 0 or not problem.capacity.any():
        x = np.zeros((problem.n_rows, problem.k))
        return PolicyResult(x, 0.0, np.zeros(problem.m), "nothing to allocate: no jobs or no workers")
    if policy == "fifo":
        x = _fifo(seen)
    else:
        x = _lp(seen, policy, water_fill)
        if not aware:
            x = _spread(seen, x)
    thr = throughput(problem, x)
    why = f"{policy} ({'aware' if aware else 'agnostic'}) over {problem.m} jobs x {problem.k} classes"
    return PolicyResult(x, evaluate(problem, policy, x), thr, why)


def throughput(problem: Problem, x: Array) -> Array:
    """(m,) steps/s each job makes under X."""
    return np.asarray(np.einsum("mrk,rk->m", problem.contrib(), x), dtype=float)


def evaluate(problem: Problem, policy: PolicyName, x: Array) -> float:
    """The policy's objective of X on the problem's rates (higher is better); jobs no class can run are
    left out of max-min and makespan, which they would otherwise pin at zero."""
    eq = equal_throughput(problem)
    live = eq > 0
    if not live.any():
        return 0.0
    thr = throughput(problem, x)
    rho = thr[live] / eq[live]
    if policy == "max_min":
        return float((rho / problem.weights[live]).min())
    if policy == "makespan":
        return float((thr[live] / problem.remaining[live]).min())
    if policy == "max_throughput":
        return float((problem.weights[live] * rho).sum())
    return float(rho.sum())


def _fifo(problem: Problem) -> Array:
    """Each job in arrival order takes up to all of its time on its fastest classes with free workers.
    On the agnostic problem all classes tie, so the fullest free class goes first (never the class list's
    order, which would be an accident of naming)."""
    x = np.zeros((problem.n_rows, problem.k))
    free = np.array(problem.capacity, dtype=float)
    allowed = problem.allowed()
    for m in sorted(range(problem.m), key=lambda i: (problem.order[i], i)):
        left = 1.0
        for j in sorted(range(problem.k), key=lambda c: (-problem.rates[m, c], -free[c], c)):
            if left <= 0 or problem.rates[m, j] <= 0 or not allowed[m, j]:
                continue
            take = min(left, free[j] / problem.scale[m])
            if take > 1e-12:
                x[m, j] = take
                free[j] -= take * problem.scale[m]
                left -= take
    return x


def _spread(problem: Problem, x: Array) -> Array:
    """A blind scheduler has no reason to prefer a class: spread each row's time over the classes it may
    use in proportion to their workers, which is what placing it on any free worker gives on average.
    (The LP's own vertex would pick classes by an accident of numbering.) Kept only if still feasible."""
    allowed = problem.allowed()
    cap = np.where(allowed, problem.capacity[None, :], 0.0)
    total = cap.sum(axis=1, keepdims=True)
    spread = x.sum(axis=1, keepdims=True) * np.divide(cap, total, out=np.zeros_like(cap), where=total > 0)
    used = (problem.row_scale()[:, None] * spread).sum(axis=0)
    return spread if (used <= problem.capacity * (1 + 1e-9) + 1e-9).all() else x


def _lp(problem: Problem, policy: PolicyName, water_fill: int) -> Array:
    n = problem.n_rows * problem.k
    eq = equal_throughput(problem)
    live = np.flatnonzero(eq > 0)
    if not len(live):
        return np.zeros((problem.n_rows, problem.k))
    gain = problem.contrib().reshape(problem.m, n)  # steps/s per unit of each X entry
    rho = gain[live] / eq[live, None]  # normalised, live jobs only
    common = np.vstack([_job_rows(problem), _cap_rows(problem)])
    common_b = np.concatenate([np.ones(problem.m), problem.capacity])
    upper = np.where(problem.allowed().reshape(n), 1.0, 0.0)
    pareto = -rho.sum(axis=0)
    if policy == "max_throughput":
        c = -(rho * problem.weights[live, None]).sum(axis=0)
        return _run(c, common, common_b, upper).reshape(problem.n_rows, problem.k)
    # max-min and makespan: one more variable t, and per live job  t * need[m] - level[m](X) <= 0
    if policy == "max_min":
        level, need = rho, problem.weights[live]
    else:
        level, need = gain[live], problem.remaining[live]
    floors = np.zeros(len(live))  # water-filling: levels frozen so far (level >= floor)
    frozen = np.zeros(len(live), dtype=bool)
    for _ in range(1 + max(0, water_fill)):
        rows = [
            np.hstack([common, np.zeros((common.shape[0], 1))]),
            np.hstack([-level[~frozen], need[~frozen, None]]),
            np.hstack([-level[frozen], np.zeros((int(frozen.sum()), 1))]),
        ]
        b = [common_b, np.zeros(int((~frozen).sum())), -floors[frozen]]
        c = np.zeros(n + 1)
        c[-1] = -1.0
        res = _highs(c, np.vstack(rows), np.concatenate(b), np.append(upper, np.inf))
        t = float(res.x[-1])
        duals = np.asarray(res.ineqlin.marginals[len(common_b) : len(common_b) + int((~frozen).sum())])
        idx = np.flatnonzero(~frozen)
        tight = np.abs(duals) > 1e-9
        if not tight.any() or water_fill <= 0:
            tight[:] = True
        floors[idx[tight]] = t * need[~frozen][tight] * (1.0 - KEEP)
        frozen[idx[tight]] = True
        if frozen.all():
            break
    if not frozen.all():
        floors[~frozen] = t * need[~frozen] * (1.0 - KEEP)
    a = np.vstack([common, -level])
    return _run(pareto, a, np.concatenate([common_b, -floors]), upper).reshape(problem.n_rows, problem.k)


def _job_rows(problem: Problem) -> Array:
    """Per job: the sum of its rows' X over all classes <= 1."""
    return np.asarray(np.kron(problem.membership(), np.ones((1, problem.k))), dtype=float)


def _cap_rows(problem: Problem) -> Array:
    """Per class: workers lent, sum over rows of scale[r] * X[r, j] <= capacity[j]."""
    return np.asarray(np.kron(problem.row_scale()[None, :], np.eye(problem.k)), dtype=float)


def _run(c: Array, a: Array, b: Array, upper: Array) -> Array:
    return np.clip(np.asarray(_highs(c, a, b, upper).x, dtype=float), 0.0, None)


def _highs(c: Array, a: Array, b: Array, upper: Array) -> OptimizeResult:
    """One HiGHS solve; dense below DENSE_MAX entries (scipy's sparse set-up costs more than it saves)."""
    bounds = np.column_stack([np.zeros(len(c)), upper])
    matrix = a if a.size <= DENSE_MAX else csr_matrix(a)
    res = linprog(c, A_ub=matrix, b_ub=b, bounds=bounds, method="highs")
    if res.status != 0:
        raise SolverError(f"HiGHS status {res.status}: {res.message}")
    return res
