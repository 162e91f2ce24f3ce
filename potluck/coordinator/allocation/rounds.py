"""The mechanism: rounds of leases that realise an allocation X, and ``allocate``, the entry point.

Each round (``round_s``, default 300 s) every row (a job, or two jobs sharing workers) with X > 0 on a
class is a candidate for that class, with Gavel's priority ``X[r, j] / received[r, j]``: the time
fraction the policy gives it over the fraction it has held so far (never held: first, larger X first).
Candidates take ``scale`` free peers of their class greedily in priority order, one class per job per
round; peers that served the row before are taken first, then idle ones, then other rows' peers.

Hysteresis, because moving a peer between jobs is a state hand-off (``handoff_s`` seconds of its work):
- a row that held a class last round counts as having received ``handoff_s`` less on it, so a challenger
  displaces it only when it lags by more than the hand-off costs (an absolute lag, in seconds, so the
  realised fractions still converge to X);
- X is re-solved every round (or every ``recompute_s``), but kept unless some entry moved by more than
  ``min_change``, or the jobs or the classes' peer counts changed (then it is re-solved at once);
- between round ends (a job or peer came or went) leases run on: departed peers and jobs drop out, and
  only peers left idle get a lease, to rows that hold none, until the same ``lease_end``.

The whole state lives in the returned ``Allocation`` record (received and present seconds), so any
coordinator holding the newest record carries on. Time comes in as ``now``; nothing here reads a clock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from potluck.coordinator.allocation.classes import ClassProfile, PeerInfo, group
from potluck.coordinator.allocation.errors import AllocationError
from potluck.coordinator.allocation.policies import solve
from potluck.coordinator.allocation.problem import make_problem
from potluck.coordinator.allocation.throughput import Throughput
from potluck.protocol.allocation import (
    Allocation,
    ClassShare,
    ClassWorkers,
    Lease,
    PolicyLabel,
    RowShare,
)

logger = logging.getLogger(__name__)

Row = tuple[str, ...]  # the job(s) of a row, sorted
Key = tuple[Row, str]  # (row, class)


@dataclass(frozen=True)
class JobDemand:
    """A job asking for peers: how many at once, its weight, what is left, when it came (FIFO)."""

    job: str
    scale: int = 1  # peers it runs on at once
    weight: float = 1.0  # priority weight: twice the weight, twice the normalised share
    remaining_steps: float = 1.0
    arrival: float = 0.0  # seconds; FIFO order


@dataclass(frozen=True)
class AllocConfig:
    policy: PolicyLabel = "max_min"  # "las": max_min with weights / attained service (worker-seconds)
    aware: bool = True  # False: the heterogeneity-blind baseline
    round_s: float = 300.0  # lease length, seconds
    handoff_s: float = 30.0  # a peer's work lost moving between jobs (state hand-off), seconds
    min_change: float = 0.05  # largest change of an X entry that keeps the previous X
    recompute_s: float = 0.0  # re-solve at most this often when nothing came or went; 0: every round
    water_fill: int = 0  # extra max-min levels (policies.solve)
    space_sharing: bool = True  # offer pair rows on shareable classes where co-located rates exist


def allocate(
    now: float,
    jobs: Sequence[JobDemand],
    peers: Sequence[PeerInfo],
    throughput: Throughput,
    policy: AllocConfig,
    prev: Allocation | None = None,
    incumbents: Mapping[str, str] | None = None,
) -> tuple[Allocation, str]:
    """The allocation for the round running at ``now``, and why it changed (see the module docstring).
    ``incumbents`` (peer -> job): who serves what before the first round (``prev`` None), e.g. the peers
    a job's running plan places; they count as that job's own peers, so the first round moves few."""
    if policy.round_s <= 0 or len({d.job for d in jobs}) != len(jobs):
        raise AllocationError("round_s must be > 0 and job names unique")
    demands = {d.job: d for d in sorted(jobs, key=lambda d: d.job)}
    classes = group(peers)
    names = list(classes)
    present, received, prev_x = _account(now, prev)
    rows: list[Row] = [(j,) for j in demands]
    pairs, pair_rates = throughput.pair_rows(list(demands), names) if policy.space_sharing else ([], None)
    pairs = [p for p in pairs if demands[rows[p[0]][0]].scale == demands[rows[p[1]][0]].scale]
    if pair_rates is not None and pairs:
        all_pairs, _ = throughput.pair_rows(list(demands), names)
        pair_rates = pair_rates[[all_pairs.index(p) for p in pairs]]
    rows += [(rows[a][0], rows[b][0]) for a, b in pairs]
    workers = {c: p.workers for c, p in classes.items()}
    changed = prev is None or set(prev.jobs) != set(demands) or workers != _prev_workers(prev)
    new_round = prev is None or now >= prev.lease_end
    due = prev is None or (new_round and now - prev.solved_at >= policy.recompute_s)
    x, solved_at, why = prev_x, prev.solved_at if prev is not None else now, "allocation kept"
    if changed or due:
        scale = np.array([demands[j].scale for j in demands], dtype=float)
        weights = np.array([demands[j].weight for j in demands], dtype=float)
        if policy.policy == "las":
            attained = np.array([_attained(j, received, demands) for j in demands])
            weights = weights / np.maximum(attained, policy.round_s)  # a round of one worker at least
            weights = weights / weights.max() if len(weights) else weights
        problem = make_problem(
            list(demands),
            names,
            [workers[c] for c in names],
            throughput.matrix(list(demands), names),
            scale=scale,
            weights=weights,
            remaining=[max(demands[j].remaining_steps, 1e-9) for j in demands],
            order=[demands[j].arrival for j in demands],
            pairs=pairs,
            pair_rates=pair_rates,
            shareable=[classes[c].shareable for c in names],
        )
        kind = "max_min" if policy.policy == "las" else policy.policy
        res = solve(problem, kind, aware=policy.aware, water_fill=policy.water_fill)
        new_x = {
            (rows[r], names[j]): float(res.x[r, j]) for r, j in zip(*np.nonzero(res.x > 1e-9), strict=True)
        }
        moved = max(
            (abs(new_x.get(k, 0.0) - prev_x.get(k, 0.0)) for k in new_x.keys() | prev_x.keys()), default=0.0
        )
        solved_at = now
        if changed or moved > policy.min_change:
            x = new_x
            why = f"re-solved {res.reason}" + (
                " (jobs or peers changed)" if changed else f", moved {moved:.3f}"
            )
    x = {k: v for k, v in x.items() if k[0] in set(rows) and k[1] in classes}
    if prev is not None:  # per device: a shared device's row is its lease's, whichever peer serves which
        prev_lease = {p: tuple(lease.jobs) for lease in prev.leases for p in lease.peers}
    else:
        prev_lease = {p: (j,) for p, j in (incumbents or {}).items() if j in demands}
    if new_round:
        number = prev.round + 1 if prev is not None else 0
        start, end = now, now + policy.round_s
        kept: list[Lease] = []
    else:
        assert prev is not None
        number, start, end = prev.round, prev.lease_start, prev.lease_end
        live = {p.peer_id for p in peers} | {p.cotenant for p in peers if p.cotenant is not None}
        kept = _surviving(prev, set(demands), live)
    leases = _place(x, present, received, demands, classes, kept, prev_lease, new_round, policy)
    # a peer moved when the job(s) it serves changed (an idle peer given a lease did not; nor does a
    # shared device's own peer that keeps its job while its co-tenant takes the second)
    served = prev.assignment() if prev is not None else {p: (j,) for p, j in (incumbents or {}).items()}
    moves = sum(1 for lease in leases for p, jobs in lease.serving().items() if served.get(p, jobs) != jobs)
    record = Allocation(
        round=number,
        policy=policy.policy,
        aware=policy.aware,
        lease_start=start,
        lease_end=end,
        solved_at=solved_at,
        classes=_class_list(classes, received),
        rows=_rows(rows, x, present, received),
        leases=leases,
        issued_at=now,
    )
    reason = f"round {number}: {why}; {len(leases)} leases, {moves} peers moved"
    logger.debug(reason)
    return record, reason


def _account(
    now: float, prev: Allocation | None
) -> tuple[dict[Row, float], dict[Key, float], dict[Key, float]]:
    """Present and received seconds up to ``now`` (leases lapse at ``lease_end``), and the previous X."""
    present: dict[Row, float] = {}
    received: dict[Key, float] = {}
    x: dict[Key, float] = {}
    if prev is None:
        return present, received, x
    dt = max(0.0, min(now, prev.lease_end) - prev.issued_at)
    for r in prev.rows:
        row = tuple(r.jobs)
        present[row] = r.present_s + dt
        for s in r.shares:
            received[(row, s.peer_class)] = s.received_s
            if s.allocation > 0:
                x[(row, s.peer_class)] = s.allocation
    for lease in prev.leases:
        key = (tuple(lease.jobs), lease.peer_class)
        received[key] = received.get(key, 0.0) + dt
    return present, received, x


def _prev_workers(prev: Allocation) -> dict[str, int]:
    return {c.peer_class: c.workers for c in prev.classes if c.workers > 0}


def _class_list(classes: dict[str, ClassProfile], received: dict[Key, float]) -> list[ClassWorkers]:
    """The live classes, and with 0 workers those gone whose received time rows still remember."""
    gone = sorted({c for (_, c), v in received.items() if c not in classes and v > 0})
    live = [ClassWorkers(peer_class=c, workers=p.workers, shareable=p.shareable) for c, p in classes.items()]
    return live + [ClassWorkers(peer_class=c, workers=0) for c in gone]


def _attained(job: str, received: dict[Key, float], demands: dict[str, JobDemand]) -> float:
    """Worker-seconds of service ``job`` has had (LAS): lease seconds times its scale."""
    return sum(v for (row, _), v in received.items() if job in row) * demands[job].scale


def _surviving(prev: Allocation, jobs: set[str], live: set[str]) -> list[Lease]:
    """The leases of ``prev`` still standing: live peers (on a shared device, with a live co-tenant)."""
    out = []
    for lease in prev.leases:
        pairs = list(zip(lease.peers, lease.partners or lease.peers, strict=True))
        pairs = [(p, q) for p, q in pairs if p in live and q in live]
        partners = [q for _, q in pairs] if lease.partners else []
        if set(lease.jobs) <= jobs and pairs:
            peers = [p for p, _ in pairs]
            out.append(Lease(jobs=lease.jobs, peer_class=lease.peer_class, peers=peers, partners=partners))
    return out


def _place(
    x: dict[Key, float],
    present: dict[Row, float],
    received: dict[Key, float],
    demands: dict[str, JobDemand],
    classes: dict[str, ClassProfile],
    kept: list[Lease],
    prev_lease: dict[str, tuple[str, ...]],
    new_round: bool,
    policy: AllocConfig,
) -> list[Lease]:
    """Greedy lease assignment in priority order (see the module docstring)."""
    taken = {p for lease in kept for p in lease.peers}
    free = {c: [p for p in prof.peers if p not in taken] for c, prof in classes.items()}
    placed = {j for lease in kept for j in lease.jobs}
    class_of = {p: c for c, prof in classes.items() for p in prof.peers}
    held = {(row, class_of[p]) for p, row in prev_lease.items() if p in class_of}  # incumbents

    def priority(key: Key) -> tuple[float, float, str, str]:
        share, row = x[key], key[0]
        # an incumbent counts as having received a hand-off less: a challenger must lag by more
        had = received.get(key, 0.0) - (policy.handoff_s if new_round and key in held else 0.0)
        got = max(had, 0.0) / present[row] if present.get(row, 0.0) > 0 else 0.0
        p = share / got if got > 0 else 1e12 * share
        deficit = share * present.get(row, 0.0) - had
        return (-p, -deficit, "+".join(row), key[1])

    leases = list(kept)
    for key in sorted(x, key=priority):
        row, c = key
        need = demands[row[0]].scale
        if placed & set(row) or len(free[c]) < need:
            continue
        own = [p for p in free[c] if prev_lease.get(p) == row]
        idle = [p for p in free[c] if p not in prev_lease]
        rest = [p for p in free[c] if prev_lease.get(p) not in (row, None)]
        chosen = (own + idle + rest)[:need]
        free[c] = [p for p in free[c] if p not in chosen]
        placed |= set(row)
        peers = sorted(chosen)
        cotenants = dict(classes[c].cotenants)
        # two jobs on live devices: each device's own peer serves the first, its co-tenant the second
        shared = len(row) == 2 and all(p in cotenants for p in peers)
        partners = [cotenants[p] for p in peers] if shared else []
        leases.append(Lease(jobs=list(row), peer_class=c, peers=peers, partners=partners))
    return leases


def _rows(
    rows: list[Row], x: dict[Key, float], present: dict[Row, float], received: dict[Key, float]
) -> list[RowShare]:
    out = []
    classes = sorted({c for _, c in x} | {c for _, c in received})
    for row in rows:
        shares = [
            ClassShare(
                peer_class=c,
                allocation=min(1.0, x.get((row, c), 0.0)),
                received_s=received.get((row, c), 0.0),
            )
            for c in classes
            if x.get((row, c), 0.0) > 0 or received.get((row, c), 0.0) > 0
        ]
        if len(row) == 1 or shares:
            out.append(RowShare(jobs=list(row), present_s=present.get(row, 0.0), shares=shares))
    return out
