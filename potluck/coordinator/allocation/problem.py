"""The allocation problem as arrays: jobs x peer classes, their rates, and the rows of X.

An allocation ``X[r, j]`` is the fraction of time row r runs on class j. A row is one job alone
(rows ``0 .. m-1``, in job order) or a pair of jobs sharing the same workers (space sharing, rows
``m ..``), as in Gavel (Narayanan et al., OSDI 2020). Rates are steps per second of a job on
``scale[m]`` workers of a class; a pair row gives each of its two jobs its co-located rate.

The constraints every policy shares:
- ``X >= 0``, and ``X[r, j] = 0`` where the class has fewer workers than the row needs, or where a pair
  row meets a class that does not allow space sharing;
- each job runs at most all of the time: ``sum of X over the rows holding m and all classes <= 1``;
- each class lends at most its workers: ``sum_r scale[r] * X[r, j] <= capacity[j]``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from potluck.coordinator.allocation.errors import AllocationError

logger = logging.getLogger(__name__)

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Problem:
    """One allocation instance. Arrays are copied read-only by ``make_problem``."""

    jobs: tuple[str, ...]
    classes: tuple[str, ...]
    capacity: Array  # (k,) workers (peers) per class
    rates: Array  # (m, k) steps/s of job m alone on scale[m] workers of class j
    scale: Array  # (m,) workers a job runs on at once (Gavel's scale factor)
    weights: Array  # (m,) priority weights: a job of weight 2 is owed twice the normalised share
    remaining: Array  # (m,) steps left (makespan), > 0
    order: Array  # (m,) FIFO key: arrival time, seconds
    pairs: tuple[tuple[int, int], ...] = ()  # space-sharing rows: job indices (a, b), a < b
    pair_rates: Array = field(default_factory=lambda: np.zeros((0, 0, 2)))  # (p, k, 2) a's, b's rate
    shareable: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=bool))  # (k,)

    @property
    def m(self) -> int:
        return len(self.jobs)

    @property
    def k(self) -> int:
        return len(self.classes)

    @property
    def n_rows(self) -> int:
        return self.m + len(self.pairs)

    def row_jobs(self, r: int) -> tuple[int, ...]:
        return (r,) if r < self.m else self.pairs[r - self.m]

    def row_name(self, r: int) -> str:
        return "+".join(self.jobs[i] for i in self.row_jobs(r))

    def row_scale(self) -> Array:
        pair_scale = [self.scale[a] for a, _ in self.pairs]
        return np.concatenate([self.scale, np.asarray(pair_scale, dtype=float)])

    def allowed(self) -> npt.NDArray[np.bool_]:
        """(rows, k): where X may be positive."""
        ok = self.row_scale()[:, None] <= self.capacity[None, :] + 1e-9
        ok[self.m :, :] &= self.shareable[None, :]
        return ok

    def contrib(self) -> Array:
        """(m, rows, k): steps/s job m makes per unit of X[r, j]."""
        c = np.zeros((self.m, self.n_rows, self.k))
        c[np.arange(self.m), np.arange(self.m), :] = self.rates
        for p, (a, b) in enumerate(self.pairs):
            c[a, self.m + p, :] = self.pair_rates[p, :, 0]
            c[b, self.m + p, :] = self.pair_rates[p, :, 1]
        return c * self.allowed()[None, :, :]

    def membership(self) -> Array:
        """(m, rows): 1 where row r holds job m."""
        mem = np.zeros((self.m, self.n_rows))
        for r in range(self.n_rows):
            mem[list(self.row_jobs(r)), r] = 1.0
        return mem


def make_problem(
    jobs: list[str] | tuple[str, ...],
    classes: list[str] | tuple[str, ...],
    capacity: npt.ArrayLike,
    rates: npt.ArrayLike,
    *,
    scale: npt.ArrayLike | None = None,
    weights: npt.ArrayLike | None = None,
    remaining: npt.ArrayLike | None = None,
    order: npt.ArrayLike | None = None,
    pairs: list[tuple[int, int]] | tuple[tuple[int, int], ...] = (),
    pair_rates: npt.ArrayLike | None = None,
    shareable: npt.ArrayLike | None = None,
) -> Problem:
    """A validated ``Problem``; defaults: scale 1, weight 1, 1 step remaining, arrival = job order."""
    m, k = len(jobs), len(classes)

    def vec(x: npt.ArrayLike | None, default: float, n: int, name: str) -> Array:
        a = np.full(n, default, dtype=float) if x is None else np.asarray(x, dtype=float).reshape(-1)
        if a.shape != (n,) or not np.isfinite(a).all():
            raise AllocationError(f"{name} needs {n} finite values, got shape {a.shape}")
        return a

    cap = vec(capacity, 0.0, k, "capacity")
    t = np.asarray(rates, dtype=float).reshape(m, k) if m and k else np.zeros((m, k))
    sc = vec(scale, 1.0, m, "scale")
    w = vec(weights, 1.0, m, "weights")
    rem = vec(remaining, 1.0, m, "remaining")
    arr = vec(order, 0.0, m, "order") if order is not None else np.arange(m, dtype=float)
    if (cap < 0).any() or (t < 0).any() or not np.isfinite(t).all():
        raise AllocationError("capacities and rates must be finite and >= 0")
    if (sc < 1).any() or (w <= 0).any() or (rem <= 0).any():
        raise AllocationError("scale factors must be >= 1, weights and remaining steps > 0")
    if len(set(jobs)) != m or len(set(classes)) != k:
        raise AllocationError("job and class names must be unique")
    pr = np.zeros((len(pairs), k, 2)) if pair_rates is None else np.asarray(pair_rates, dtype=float)
    if pr.shape != (len(pairs), k, 2) or (pr < 0).any() or not np.isfinite(pr).all():
        raise AllocationError(f"pair_rates needs shape ({len(pairs)}, {k}, 2) of finite rates >= 0")
    for a, b in pairs:
        if not 0 <= a < b < m:
            raise AllocationError(f"pair ({a}, {b}) must name two jobs, lower index first")
        if sc[a] != sc[b]:
            # Both jobs of a pair run on the same workers, so they must want as many of them.
            raise AllocationError(f"jobs {jobs[a]} and {jobs[b]} have different scale factors")
    sh = np.zeros(k, dtype=bool) if shareable is None else np.asarray(shareable, dtype=bool).reshape(k)
    for frozen in (cap, t, sc, w, rem, arr, pr, sh):
        frozen.setflags(write=False)
    return Problem(tuple(jobs), tuple(classes), cap, t, sc, w, rem, arr, tuple(pairs), pr, sh)


def equal_share(problem: Problem) -> Array:
    """(m, k) the heterogeneity-blind equal split that normalises throughputs (Gavel's X_eq).

    Every job gets the same time fraction of every class, in proportion to the class's size, scaled down
    until the workers suffice: ``X_eq[m, j] = capacity[j] / C * min(1, C / S)`` with C the workers of
    the classes the job can use and S the workers all jobs ask for. Feasible by construction.
    """
    allowed = problem.allowed()[: problem.m]
    cap = np.where(allowed, problem.capacity[None, :], 0.0)
    total = cap.sum(axis=1, keepdims=True)
    demand = float(problem.scale.sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(total > 0, cap / total, 0.0)
    fit = min(1.0, float(problem.capacity.sum()) / demand) if demand > 0 else 0.0
    return np.asarray(share * fit, dtype=float)


def equal_throughput(problem: Problem) -> Array:
    """(m,) steps/s of each job under the equal split: the unit of normalised throughput."""
    return np.asarray((problem.rates * equal_share(problem)).sum(axis=1), dtype=float)


def agnostic(problem: Problem) -> Problem:
    """The same problem as a heterogeneity-blind scheduler sees it: each job's rate (and each pair's
    co-located rates) averaged over the classes it may use, the same on every class (Gavel's baseline)."""
    allowed = problem.allowed()
    single = allowed[: problem.m]
    n = np.maximum(single.sum(axis=1, keepdims=True), 1)
    mean = (problem.rates * single).sum(axis=1, keepdims=True) / n
    rates = np.where(single, mean, 0.0)
    pr = np.array(problem.pair_rates, dtype=float)
    if len(problem.pairs):
        pa = allowed[problem.m :]
        npair = np.maximum(pa.sum(axis=1), 1)[:, None]
        pmean = (pr * pa[:, :, None]).sum(axis=1) / npair
        pr = np.where(pa[:, :, None], pmean[:, None, :], 0.0)
    pr.setflags(write=False)
    rates.setflags(write=False)
    return replace(problem, rates=rates, pair_rates=pr)
