"""Lower bounds on the objective, so every plan reports how far from optimal it can at most be.

- DT-FM objective, any size: combinatorial. Every device sits in some group of R, so the DP term is at
  least its R-1 cheapest partners' weights (max over devices). Every stage group has an incident path
  edge, and an edge is at least the largest "cheapest link" of a device in either group; summing over a
  path leaves out at most one group's value, giving a bound from the sorted per-device minima.
- DT-FM objective, tiny instances: the exact optimum by enumeration (exhaustive.py).
- DT-FM objective, small instances: a mixed-integer program solved by scipy's HiGHS with a time limit;
  its dual bound is a valid lower bound whether or not it finishes.
- Step objective: perfect scaling, i.e. the step's FLOPs over the swarm's total TFLOP/s.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_matrix

from potluck.coordinator.placement.costmodel import DeviceSpec, StepJob
from potluck.coordinator.placement.exhaustive import dtfm_optimum, feasible, partition_count
from potluck.coordinator.placement.objectives import DtfmObjective

MILP_MAX_DEVICES = 16


def dtfm_combinatorial(obj: DtfmObjective, devices: np.ndarray) -> float:
    dp, pp = _dtfm_terms(obj, devices)
    return dp + 2.0 * pp


def _dtfm_terms(obj: DtfmObjective, devices: np.ndarray) -> tuple[float, float]:
    """Combinatorial lower bounds on the DP term and on the (one-direction) PP path sum."""
    s, r = obj.n_stages, obj.n_replicas
    used = s * r  # with spares, only the S*R devices in the layout count: drop the worst values
    w_dp = obj.w_dp[np.ix_(devices, devices)] + np.diag(np.full(len(devices), np.inf))
    w_pp = obj.link[np.ix_(devices, devices)].copy()
    np.fill_diagonal(w_pp, np.inf)
    dp = 0.0
    if r > 1:
        partners = np.sort(np.sort(w_dp, axis=1)[:, : r - 1].sum(axis=1))
        dp = float(partners[used - 1])  # the largest among the `used` smallest
    cheapest = np.sort(np.sort(w_pp.min(axis=1))[:used])[::-1]
    # The k-th largest group maximum is at least the (k*R)-th largest device minimum.
    pp = float(sum(cheapest[k * r] for k in range(s - 1))) if s > 1 else 0.0
    return dp, pp


def dtfm_milp(obj: DtfmObjective, devices: np.ndarray, time_limit_s: float) -> tuple[float, bool]:
    """(lower bound, proven optimal) from a MILP over slot assignments z[d, i, j].

    z[d,i,j] = 1 if device d runs stage j of pipeline i; stage index = position in the pipeline, so the
    order is part of the model. q[d,e,j] >= x[d,j] + x[e,j] - 1 linearises "d and e share group j".
    Variables: z (N*R*S), q (N*N*S, d < e used), G (max DP), E_j (matched link per boundary; on an
    asymmetric network one per direction, F_j forward and B_j backward, each weighing half of 2 E_j).
    """
    s, r, n = obj.n_stages, obj.n_replicas, len(devices)
    w_dp = obj.w_dp[np.ix_(devices, devices)]
    w_pp = obj.link[np.ix_(devices, devices)]
    w_fwd = obj.w_pp[np.ix_(devices, devices)]
    nz = n * r * s
    pairs = [(d, e) for d in range(n) for e in range(d + 1, n)]
    nq = len(pairs) * s
    g_idx, e0 = nz + nq, nz + nq + 1
    b0 = e0 + max(s - 1, 0)  # backward boundary variables (directional only)
    nv = b0 + (max(s - 1, 0) if obj.directional else 0)

    def z(d: int, i: int, j: int) -> int:
        return (d * r + i) * s + j

    def q(p: int, j: int) -> int:
        return nz + p * s + j

    rows: list[tuple[dict[int, float], float, float]] = []
    for i in range(r):
        for j in range(s):
            rows.append(({z(d, i, j): 1.0 for d in range(n)}, 1.0, 1.0))
    for d in range(n):
        rows.append(({z(d, i, j): 1.0 for i in range(r) for j in range(s)}, 0.0, 1.0))
    for p, (d, e) in enumerate(pairs):
        for j in range(s):
            coef = {q(p, j): 1.0}
            for i in range(r):
                coef[z(d, i, j)] = coef.get(z(d, i, j), 0.0) - 1.0
                coef[z(e, i, j)] = coef.get(z(e, i, j), 0.0) - 1.0
            rows.append((coef, -1.0, np.inf))
    pair_of = {pe: p for p, pe in enumerate(pairs)}
    for d in range(n):
        for j in range(s):
            coef = {g_idx: 1.0}
            for e in range(n):
                if e != d:
                    coef[q(pair_of[(min(d, e), max(d, e))], j)] = -float(w_dp[d, e])
            rows.append((coef, 0.0, np.inf))
    for j in range(s - 1):
        for i in range(r):
            for d in range(n):
                for e in range(n):
                    if d == e:
                        continue
                    if not obj.directional:
                        w = float(w_pp[d, e])
                        rows.append(({e0 + j: 1.0, z(d, i, j): -w, z(e, i, j + 1): -w}, -w, np.inf))
                        continue
                    for var, w in ((e0 + j, float(w_fwd[d, e])), (b0 + j, float(w_fwd[e, d]))):
                        rows.append(({var: 1.0, z(d, i, j): -w, z(e, i, j + 1): -w}, -w, np.inf))
    # Pipelines are interchangeable: order them by the index of their stage-0 device.
    for i in range(r - 1):
        coef = {z(d, i, 0): float(d) for d in range(n)}
        for d in range(n):
            coef[z(d, i + 1, 0)] = coef.get(z(d, i + 1, 0), 0.0) - float(d)
        rows.append((coef, -np.inf, 0.0))
    a = lil_matrix((len(rows), nv))
    lo, hi = np.empty(len(rows)), np.empty(len(rows))
    for k, (coef, lb, ub) in enumerate(rows):
        for v, c in coef.items():
            a[k, v] = c
        lo[k], hi[k] = lb, ub
    cost = np.zeros(nv)
    cost[g_idx] = 1.0
    cost[e0:] = 1.0 if obj.directional else 2.0
    integrality = np.zeros(nv)
    integrality[:nz] = 1
    upper = np.full(nv, np.inf)
    upper[:nz] = 1.0
    lower = np.zeros(nv)
    lower[g_idx] = _dtfm_terms(obj, devices)[0]  # a valid cut that lifts the root relaxation
    res = milp(
        cost,
        constraints=LinearConstraint(a.tocsr(), lo, hi),
        integrality=integrality,
        bounds=Bounds(lower, upper),
        options={"time_limit": time_limit_s, "disp": False},
    )
    bound = getattr(res, "mip_dual_bound", None)
    if res.status == 0 and res.fun is not None:
        return float(res.fun), True
    if bound is None or not np.isfinite(bound):
        return 0.0, False
    return float(bound), False


def dtfm_lower_bound(obj: DtfmObjective, devices: np.ndarray, time_limit_s: float) -> tuple[float, str]:
    """Best available bound and how it was obtained (exact enumeration, MILP, or combinatorial)."""
    comb = dtfm_combinatorial(obj, devices)
    n, s, r = len(devices), obj.n_stages, obj.n_replicas
    # Enumeration runs at roughly 300k partitions per second here; stay inside the time limit.
    if feasible(n, s, r) and partition_count(n, s, r) <= 300_000 * time_limit_s:
        return dtfm_optimum(obj, devices), "exhaustive-optimal"
    if len(devices) <= MILP_MAX_DEVICES and time_limit_s > 0:
        value, optimal = dtfm_milp(obj, devices, time_limit_s)
        if value >= comb:
            return value, "milp-optimal" if optimal else "milp-dual"
    return comb, "combinatorial"


def step_lower_bound(devices: Sequence[DeviceSpec], job: StepJob) -> float:
    """Perfect scaling: the step's training FLOPs spread over every device at its full TFLOP/s."""
    m = job.model
    tokens = job.batch.sequences_per_step * m.seq_len
    flops = 3.0 * tokens * (m.flops_per_token_layer * m.layers + 2.0 * m.embed_params)
    total = sum(d.tflops for d in devices) * 1e12
    return flops / total if total > 0 else 0.0
