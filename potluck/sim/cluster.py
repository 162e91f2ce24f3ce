"""A round-based simulator of a shared cluster, on Gavel's measured throughputs (tests and benchmarks).

It drives the real ``allocate`` round after round on a virtual clock: jobs arrive (Poisson), each with a
number of steps, run at the rate of the class their lease names (Gavel's measured steps/s), pay the
hand-off (``handoff_s`` of no progress) when their peers changed, and finish; the result is each job's
completion time (JCT = finish - arrival). The data is parsed elsewhere (``load_gavel`` takes the JSON
already read): no file, no clock here.

The trace generator is ours, after Gavel's description: a job type drawn uniformly among those measured
on every class; a duration on a V100 of ``10**U(1.5, 3)`` minutes with probability 0.8, else
``10**U(3, 4)`` minutes; steps = duration x the type's V100 rate.
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from potluck.coordinator.allocation.classes import PeerInfo
from potluck.coordinator.allocation.problem import Problem, make_problem
from potluck.coordinator.allocation.rounds import AllocConfig, JobDemand, allocate
from potluck.coordinator.allocation.throughput import Throughput
from potluck.protocol.allocation import Allocation

logger = logging.getLogger(__name__)

GAVEL_CLASSES = ("k80", "p100", "v100")
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


@dataclass(frozen=True)
class GavelTable:
    """Gavel's measurements: steps/s of (job type, scale) alone per class, and of co-located pairs."""

    single: Mapping[tuple[str, int], Mapping[str, float]]
    paired: Mapping[tuple[str, str, str], tuple[float, float]]  # (type a, type b, class), scale 1

    def types(self, scale: int = 1) -> list[str]:
        """Job types measured (non-zero) on every class at ``scale``, sorted."""
        return sorted(
            t
            for (t, s), r in self.single.items()
            if s == scale and all(r.get(c, 0) > 0 for c in GAVEL_CLASSES)
        )


def load_gavel(raw: Mapping[str, Mapping[str, Mapping[str, object]]]) -> GavelTable:
    """Parse ``simulation_throughputs.json`` (already loaded): keys ``"('type', scale)"``."""
    single: dict[tuple[str, int], dict[str, float]] = {}
    paired: dict[tuple[str, str, str], tuple[float, float]] = {}
    for cls in GAVEL_CLASSES:
        for key, cell in raw[cls].items():
            name, scale = ast.literal_eval(key)
            for other, value in cell.items():
                if other == "null":
                    single.setdefault((name, int(scale)), {})[cls] = float(value)  # type: ignore[arg-type]
                elif int(scale) == 1:
                    oname, oscale = ast.literal_eval(other)
                    if int(oscale) == 1 and isinstance(value, list) and len(value) == 2:
                        paired[(name, oname, cls)] = (float(value[0]), float(value[1]))
    return GavelTable(single, paired)


def random_problem(rng: np.random.Generator, table: GavelTable, max_jobs: int = 8) -> Problem:
    """A random instance: 2..max_jobs jobs of measured types, 1..8 workers per class, random steps."""
    types = table.types()
    m = int(rng.integers(2, max_jobs + 1))
    picked = [types[int(i)] for i in rng.integers(0, len(types), size=m)]
    rates = [[table.single[(t, 1)][c] for c in GAVEL_CLASSES] for t in picked]
    return make_problem(
        [f"job-{i}" for i in range(m)],
        GAVEL_CLASSES,
        rng.integers(1, 9, size=3),
        rates,
        remaining=rng.uniform(1e3, 1e5, size=m),
        weights=rng.choice([1.0, 2.0], size=m),
    )


@dataclass(frozen=True)
class TraceJob:
    job: str
    job_type: str
    arrival: float  # seconds
    steps: float
    scale: int = 1  # workers it runs on at once


def poisson_trace(
    rng: np.random.Generator,
    table: GavelTable,
    n_jobs: int,
    jobs_per_hour: float,
    scales: Mapping[int, float] | None = None,
) -> list[TraceJob]:
    """``n_jobs`` jobs arriving at ``jobs_per_hour`` on average; ``scales``: probability of each scale
    factor (default: all single-worker jobs)."""
    sizes = sorted((scales or {1: 1.0}).items())
    t = 0.0
    out = []
    for i in range(n_jobs):
        scale = int(sizes[int(rng.choice(len(sizes), p=[p for _, p in sizes]))][0])
        types = table.types(scale)
        kind = types[int(rng.integers(0, len(types)))]
        lo, hi = (1.5, 3.0) if rng.random() < 0.8 else (3.0, 4.0)
        minutes = 10 ** rng.uniform(lo, hi)
        steps = minutes * 60.0 * table.single[(kind, scale)]["v100"]
        out.append(TraceJob(f"job-{i:04d}", kind, t, steps, scale))
        t += float(rng.exponential(3600.0 / jobs_per_hour))
    return out


def peer_id(i: int) -> str:
    """A fake but valid peer id (base58) for simulated peer ``i``."""
    digits = ""
    while True:
        i, d = divmod(i, 58)
        digits = _B58[d] + digits
        if i == 0:
            break
    return "12D3KooWsimpeer" + digits.rjust(8, "1")


def cluster(counts: Mapping[str, int], shareable: bool = False) -> list[PeerInfo]:
    """Simulated peers, ``counts[class]`` of each class, named by the class; ``shareable``: each may run
    two jobs at once (space sharing, at Gavel's measured co-located rates)."""
    peers, n = [], 0
    for cls, k in counts.items():
        for _ in range(k):
            peers.append(PeerInfo(peer_id(n), peer_class=cls, shareable=shareable))
            n += 1
    return peers


@dataclass
class SimResult:
    jct: dict[str, float] = field(default_factory=dict)  # job -> completion time, seconds
    rounds: int = 0
    solves: int = 0
    moves: int = 0
    shared_rounds: int = 0  # (round, lease) pairs where two jobs shared the workers

    @property
    def mean_jct(self) -> float:
        return float(np.mean(list(self.jct.values()))) if self.jct else float("nan")


def simulate(
    trace: Sequence[TraceJob],
    table: GavelTable,
    peers: Sequence[PeerInfo],
    config: AllocConfig,
    *,
    max_rounds: int = 100_000,
) -> SimResult:
    """Run ``trace`` to completion (or ``max_rounds``) with leases from ``allocate``. With shareable
    ``peers`` (and ``config.space_sharing``), two single-worker jobs may share a worker at Gavel's
    measured co-located rates of their types."""
    single = {(j.job, c): table.single[(j.job_type, j.scale)][c] for j in trace for c in GAVEL_CLASSES}
    paired: dict[tuple[str, str, str], tuple[float, float]] = {}
    if config.space_sharing and any(p.shareable for p in peers):
        ones = sorted((j for j in trace if j.scale == 1), key=lambda j: j.job)
        for i, a in enumerate(ones):
            for b in ones[i + 1 :]:
                for c in GAVEL_CLASSES:
                    both = table.paired.get((a.job_type, b.job_type, c))
                    if both is not None and min(both) > 0:
                        paired[(a.job, b.job, c)] = both
    rates = Throughput(single, paired)
    left = {j.job: j.steps for j in trace}
    pending = sorted(trace, key=lambda j: j.arrival)
    arrived: dict[str, TraceJob] = {}
    res = SimResult()
    prev: Allocation | None = None
    now = pending[0].arrival if pending else 0.0
    while (pending or arrived) and res.rounds < max_rounds:
        while pending and pending[0].arrival <= now:
            came = pending.pop(0)
            arrived[came.job] = came
        if not arrived:
            now = max(now, pending[0].arrival)
            continue
        demands = [
            JobDemand(j, scale=arrived[j].scale, remaining_steps=left[j], arrival=arrived[j].arrival)
            for j in arrived
        ]
        before = prev.assignment() if prev is not None else {}
        prev, reason = allocate(now, demands, peers, rates, config, prev)
        res.rounds += 1
        res.solves += reason.split(": ", 1)[1].startswith("re-solved")
        for lease in prev.leases:
            fresh = any(before.get(p) != tuple(lease.jobs) for p in lease.peers)
            res.moves += fresh
            busy = config.round_s - (config.handoff_s if fresh else 0.0)  # seconds of progress
            if len(lease.jobs) == 2:
                first, second = lease.jobs
                ra, rb = rates.paired[(first, second, lease.peer_class)]
                res.shared_rounds += 1
                runs = [(first, ra), (second, rb)]
            else:
                runs = [(lease.jobs[0], rates.single[(lease.jobs[0], lease.peer_class)])]
            for job, rate in runs:
                if left[job] <= rate * busy:
                    finish = now + config.round_s - busy + left[job] / rate
                    res.jct[job] = finish - arrived[job].arrival
                    del arrived[job]
                    left[job] = 0.0
                else:
                    left[job] -= rate * busy
        now += config.round_s
    return res
