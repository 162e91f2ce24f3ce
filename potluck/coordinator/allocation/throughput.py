"""Effective throughput: each job's rate (steps/s) on each peer class, as the policies see it.

- **Prior** (``prior_rate``): until a job has run on a class, the cost model's arithmetic
  (``placement.costmodel``: FLOPs and bytes of state of the job's ``ModelSpec``) over the class's
  slowest member: the step's FLOPs split evenly over the job's workers, plus the activations of a step
  crossing one stage boundary over the class's uplink when it runs on more than one peer. Zero where
  the model's state does not fit in the workers' memory.
- **Measured** (``observe``): an exponential moving average of steps/s from the job's progress records,
  ``rate <- rate + alpha * (sample - rate)``, alpha = 0.3 (a sample per round; about 3 rounds to follow
  a change). Measured rates replace the prior once a sample exists.
- **Churn discount** (``churn_discount``): a class whose peers leave at ``lambda`` departures per
  peer-second costs the job ``recovery_s`` seconds of a peer's work per departure (the state hand-off
  and re-plan), so its useful share of time is ``1 / (1 + lambda * recovery_s)``. ``lambda`` counts
  departures over observed peer-seconds plus a pseudo-observation of ``PRIOR_PEER_S`` peer-seconds
  without a departure, so a class seen for minutes is not written off after one leaver.

- **Co-located** (space-shared) rates, on classes whose devices run a co-tenant peer: each job's rate
  alone times half the devices' measured pair speedup (``pair_prior``; zero when the two jobs' state
  does not fit together), replaced by each job's measured rate in the pair once its progress shows it
  (Gavel estimates unseen pairs by matrix completion; here the prior stands in until measured). A job
  measured only in a pair is estimated alone from that rate the same way, inverted: the cost model's
  prior is never weighed against a measured rate.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from potluck.coordinator.allocation.classes import ClassProfile
from potluck.coordinator.allocation.problem import Array
from potluck.coordinator.placement.costmodel import (
    BatchSpec,
    ModelShape,
    StepJob,
    layer_memory,
    micro_batch_flops,
)
from potluck.protocol.jobspec import JobSpec

logger = logging.getLogger(__name__)

EMA_ALPHA = 0.3
PRIOR_PEER_S = 6 * 3600.0  # pseudo-observation: six peer-hours without a departure
DEFAULT_UPLINK_GBPS = 0.02  # an undeclared home uplink: 20 Mbit/s
GB = 1e9


@dataclass(frozen=True)
class RateEstimate:
    """A job's measured rate on a class: steps/s, and how many samples made it."""

    rate: float
    samples: int = 1


@dataclass(frozen=True)
class ChurnStats:
    """How long a class's peers were watched (peer-seconds) and how many of them left meanwhile."""

    peer_s: float = 0.0
    departures: int = 0


def observe(
    prev: RateEstimate | None, steps: float, seconds: float, alpha: float = EMA_ALPHA
) -> RateEstimate:
    """Fold one progress sample (``steps`` done in ``seconds`` of lease time) into the estimate."""
    if seconds <= 0 or steps < 0:
        return prev if prev is not None else RateEstimate(0.0, 0)
    sample = steps / seconds
    if prev is None or prev.samples == 0:
        return RateEstimate(sample, 1)
    return RateEstimate(prev.rate + alpha * (sample - prev.rate), prev.samples + 1)


MAX_WATCH_GAP_S = 120.0  # a longer gap between polls (a stalled coordinator) is not counted as watching


def watch_churn(
    stats: Mapping[str, ChurnStats],
    before: Mapping[str, str],
    after: Mapping[str, str],
    seconds: float,
) -> dict[str, ChurnStats]:
    """Fold one poll into each class's churn: ``before`` and ``after`` map the live peers to their class
    at the last poll and now. Every peer of ``before`` was watched ``seconds`` (capped at
    ``MAX_WATCH_GAP_S``) in its class then; one absent from ``after`` departed from that class (a graceful
    leave counts: it costs a hand-off too). A peer that changed class did not depart."""
    out = dict(stats)
    watched = min(max(seconds, 0.0), MAX_WATCH_GAP_S)
    for peer, name in before.items():
        old = out.get(name, ChurnStats())
        gone = 0 if peer in after else 1
        out[name] = ChurnStats(old.peer_s + watched, old.departures + gone)
    return out


def churn_discount(stats: ChurnStats | None, recovery_s: float) -> float:
    """The share of a class's lease time that is useful work, in (0, 1] (see the module docstring)."""
    if stats is None or recovery_s <= 0:
        return 1.0
    lam = stats.departures / (stats.peer_s + PRIOR_PEER_S)  # departures per peer-second
    return 1.0 / (1.0 + lam * recovery_s)


def _step_job(spec: JobSpec) -> StepJob:
    shape = ModelShape.from_spec(spec.model)
    return StepJob(shape, BatchSpec(spec.sequences_per_step, spec.batch.micro_batch_size), recompute=False)


def device_bytes(spec: JobSpec, workers: int) -> float:
    """Device memory each of ``workers`` peers needs for ``spec``'s state, with the cost model's
    headroom, in bytes (the whole model split evenly)."""
    job = _step_job(spec)
    state, _ = layer_memory(job)
    total_bytes = state * job.model.layers + 2.0 * job.model.embed_params * job.bytes_per_param
    return total_bytes / max(workers, 1) / job.memory_headroom


def prior_rate(spec: JobSpec, cls: ClassProfile, workers: int) -> float:
    """Steps/s the cost model expects of ``spec`` on ``workers`` peers of class ``cls``."""
    if workers < 1 or cls.tflops <= 0 or device_bytes(spec, workers) > cls.memory_gb * GB:
        return 0.0
    job = _step_job(spec)
    shape = job.model
    work, head = micro_batch_flops(job)
    n_micro = spec.sequences_per_step / spec.batch.micro_batch_size
    compute_s = n_micro * (work * shape.layers + head) / (workers * cls.tflops * 1e12)
    comm_s = 0.0
    if workers > 1:
        # fp16 activations forward and their gradients back, across one stage boundary, in bits
        bits = 2 * 2.0 * spec.batch.tokens_per_step * shape.d_model * 8.0
        comm_s = bits / ((cls.uplink_gbps or DEFAULT_UPLINK_GBPS) * GB)
    return 1.0 / (compute_s + comm_s)


@dataclass(frozen=True)
class Throughput:
    """Effective rates as the allocator reads them; a (job, class) not listed runs at 0 steps/s."""

    single: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (job, class) -> steps/s
    # (job a, job b, class) -> (a's, b's) steps/s when the two share the class's workers; a < b
    paired: Mapping[tuple[str, str, str], tuple[float, float]] = field(default_factory=dict)

    def matrix(self, jobs: Sequence[str], classes: Sequence[str]) -> Array:
        return np.array([[self.single.get((j, c), 0.0) for c in classes] for j in jobs], dtype=float)

    def pair_rows(self, jobs: Sequence[str], classes: Sequence[str]) -> tuple[list[tuple[int, int]], Array]:
        """Pairs of jobs (indices) with a measured co-located rate on some class, and those rates."""
        index = {j: i for i, j in enumerate(jobs)}
        found: dict[tuple[int, int], Array] = {}
        for (a, b, c), (ra, rb) in sorted(self.paired.items()):
            if a in index and b in index and c in classes:
                ia, ib = sorted((index[a], index[b]))
                if (ia, ib) not in found:
                    found[(ia, ib)] = np.zeros((len(classes), 2))
                first, second = (ra, rb) if index[a] < index[b] else (rb, ra)
                found[(ia, ib)][list(classes).index(c)] = (first, second)
        pairs = sorted(found)
        rates = np.array([found[p] for p in pairs]).reshape(len(pairs), len(classes), 2)
        return pairs, rates


PairKey = tuple[str, tuple[str, str], str]  # (job, the pair's jobs sorted, class): a job's rate in a pair


def pair_prior(
    single_a: float, single_b: float, fits: bool, pair_speedup: float | None
) -> tuple[float, float]:
    """Each job's steps/s while two share a class's devices, before it is measured: its rate alone times
    half the pair speedup the devices measured at start-up (two matmul streams' throughput over one's;
    1.0 when not measured, where sharing only ties with time slicing). Zero when the two jobs' state
    does not fit the devices' memory together (``fits``)."""
    if not fits:
        return 0.0, 0.0
    share = (pair_speedup if pair_speedup is not None else 1.0) / 2.0
    return single_a * share, single_b * share


def estimate(
    jobs: Mapping[str, tuple[JobSpec | None, int]],
    classes: Mapping[str, ClassProfile],
    measured: Mapping[tuple[str, str], RateEstimate],
    churn: Mapping[str, ChurnStats] | None = None,
    recovery_s: float = 60.0,
    paired: Mapping[tuple[str, str, str], tuple[float, float]] | None = None,
    measured_pairs: Mapping[PairKey, RateEstimate] | None = None,
) -> Throughput:
    """Rates for every (job, class): measured where sampled, else the prior of the job's spec and scale
    (``jobs``: job -> (spec or None, workers)); both times the class's churn discount.

    On shareable classes also every pair of jobs: each job's measured rate in that pair
    (``measured_pairs``), else ``pair_prior``. ``paired`` (given rates, e.g. Gavel's table) wins."""
    churn = churn or {}
    got = measured_pairs or {}
    single: dict[tuple[str, str], float] = {}
    for job, (spec, workers) in jobs.items():
        for name, cls in classes.items():
            est = measured.get((job, name))
            shared = [e.rate for (j, _, c), e in got.items() if j == job and c == name and e.samples]
            if est is not None and est.samples > 0:
                rate = est.rate
            elif shared:
                # measured only in a pair: alone it runs at that rate over its share of the pair speedup,
                # not at the cost model's guess (which two measured rates must not be weighed against)
                rate = max(shared) * 2.0 / (cls.pair_speedup if cls.pair_speedup is not None else 1.0)
            else:
                rate = prior_rate(spec, cls, workers) if spec is not None else 0.0
            single[(job, name)] = rate
    pairs = dict(paired or {})
    names = sorted(jobs)
    for name, cls in classes.items():
        if not cls.shareable:
            continue
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                if (a, b, name) in pairs:
                    continue
                (sa, wa), (sb, wb) = jobs[a], jobs[b]
                # both jobs' state on each device at once
                fits = (
                    sa is not None
                    and sb is not None
                    and device_bytes(sa, wa) + device_bytes(sb, wb) <= cls.memory_gb * GB
                )
                ra, rb = pair_prior(single[(a, name)], single[(b, name)], fits, cls.pair_speedup)
                ea, eb = got.get((a, (a, b), name)), got.get((b, (a, b), name))
                pairs[(a, b, name)] = (
                    ea.rate if ea is not None and ea.samples > 0 else ra,
                    eb.rate if eb is not None and eb.samples > 0 else rb,
                )

    def useful(name: str) -> float:
        return churn_discount(churn.get(name), recovery_s)

    single = {k: v * useful(k[1]) for k, v in single.items()}
    pair_out = {key: (ra * useful(key[2]), rb * useful(key[2])) for key, (ra, rb) in pairs.items()}
    return Throughput(single, pair_out)
