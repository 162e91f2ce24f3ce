"""What the coordinator believes of each peer's speed on its job: TFLOP/s measured while training (from
the plan a peer last ran in, ``plan.calibrated_tflops``), and the peers whose measurement fell far below
their claim (``claims.overclaimed``): their later claims are not believed.

A plan prices a peer by its *device's* measured speed (``planning_speeds``): the FLOPs that every peer
of the same device did over the seconds they took, pooled. One peer's own FLOP rate depends on the work
its stage gave it, not only on its hardware: a step has costs the FLOP count misses (the optimizer,
the codec, each layer's call overhead, the embedding), so a stage of one layer measures slower per FLOP
than a stage of three on the same chip. Priced one by one, the three-layer peers looked up to 3x faster,
the next plan gave them still more layers, and the split never came back (churn run H: 11 of 15 plans
cut 4 equal layers 1:3 or 3:1; the swarm ran ~20% below the 2:2 baseline between kills). A peer well
below the replicas of its own stage, which did the same work, is a straggler and keeps that ratio; one
without replicas to compare with is, below 0.4x its device's pooled speed (further than the stage's
share of work moves a FLOP rate), priced at its own rate.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Collection, Mapping, Sequence

from potluck.coordinator.job.claims import overclaimed
from potluck.coordinator.job.plan import calibrated_tflops
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import TrainPlan

logger = logging.getLogger(__name__)

# A peer measured below this fraction of the median of its stage's replicas (the same work) is slower
# than its device, not noise: two replicas on a busy shared machine differ by 10-30%.
STRAGGLER_RATIO = 0.7
# A peer without such replicas is a straggler below this fraction of its device's pooled speed: further
# than a stage's share of work moves one peer's FLOP rate (one layer against three: ~2x on a tiny model).
DEVICE_STRAGGLER_RATIO = 0.4


def planning_speeds(
    work: Mapping[str, tuple[float, float]],
    devices: Mapping[str, str],
    same_work: Sequence[Collection[str]] = (),
) -> dict[str, float]:
    """TFLOP/s per peer for planning. ``work``: peer -> (TFLOP, seconds) of its last measured step;
    ``devices``: peer -> its device (kind and name; a peer not in it is priced alone); ``same_work``:
    groups of peers measured on the same stage of the same plan, whose slow members are stragglers."""
    pooled: dict[str, list[float]] = {}
    for p, (tflop, seconds) in work.items():
        if p in devices and seconds > 0:
            acc = pooled.setdefault(devices[p], [0.0, 0.0])
            acc[0] += tflop
            acc[1] += seconds
    own = {p: tflop / seconds for p, (tflop, seconds) in work.items() if seconds > 0 and tflop > 0}
    out = {
        p: (pooled[devices[p]][0] / pooled[devices[p]][1] if p in devices else rate)
        for p, rate in own.items()
    }
    compared = set()
    for group in same_work:
        rates = [own[p] for p in group if p in own]
        if len(rates) < 2:
            continue
        median = statistics.median(rates)
        for p in group:
            if p in own:
                compared.add(p)
                if own[p] < STRAGGLER_RATIO * median:
                    out[p] *= own[p] / median
    for p, rate in own.items():
        if p not in compared and rate < DEVICE_STRAGGLER_RATIO * out[p]:
            out[p] = rate
    return out


class MeasuredSpeeds:
    def __init__(self) -> None:
        self.work: dict[str, tuple[float, float]] = {}  # peer -> (TFLOP, seconds) of its latest measurement
        self.origin: dict[str, tuple[int, int]] = {}  # peer -> (plan epoch, stage) of that measurement
        self.distrusted: set[str] = set()  # peers measured far below their claims

    def update(
        self,
        plan: TrainPlan | None,
        job: JobSpec,
        compute_s: Mapping[str, float],
        claims: Mapping[str, float],
        devices: Mapping[str, str],
    ) -> dict[str, float]:
        """Fold ``plan``'s measured compute times (peer -> seconds of its last step) in, note the peers
        that claim (``claims``: peer -> TFLOP/s) far more than measured, and return the speeds a plan
        prices (``planning_speeds``; ``devices``: peer -> its device, the live peers)."""
        if plan is not None:
            rates = calibrated_tflops(plan, job, dict(compute_s))
            for j, st in enumerate(plan.stages):
                for p in st.peers:
                    if p in rates:
                        self.work[p], self.origin[p] = (
                            (rates[p] * compute_s[p], compute_s[p]),
                            (plan.epoch, j),
                        )
        self.work = {p: w for p, w in self.work.items() if p in devices}  # peers gone since: forgotten
        self.origin = {p: self.origin[p] for p in self.work}
        measured = {p: tflop / seconds for p, (tflop, seconds) in self.work.items()}
        for peer in overclaimed(claims, measured):
            if peer not in self.distrusted:
                self.distrusted.add(peer)
                logger.warning(
                    "peer %s claims %.3g TFLOP/s but measured %.3g on this job: its claims are not believed",
                    peer,
                    claims[peer],
                    measured[peer],
                )
        same_work: dict[tuple[int, int], list[str]] = {}  # measured on the same stage of the same plan
        for p, at in self.origin.items():
            same_work.setdefault(at, []).append(p)
        return planning_speeds(self.work, devices, list(same_work.values()))
