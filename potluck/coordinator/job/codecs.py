"""Which activation codec each pipeline link uses, and what the planner prices links with. Pure.

A job may name a second activation chain for slow links (``compression.activations_slow``, used over
any direction slower than ``compression.slow_link_gbps``): compressing hard only where the link is the
bottleneck keeps the better codec's accuracy on fast links and costs little where links are fast.

* ``select_link_codecs``: the chain of every direction of every boundary link (stage j replica i ->
  stage j + 1 replica i) of a placement, by the directed bandwidth the planner measured for it; what the
  coordinator signs into ``TrainPlan.link_codecs``.
* ``codec_ratios``: the step-time model's ``CodecRatios`` for the job: fast links (LAN) at the
  ``activations`` chain's ratio, slow ones at ``activations_slow``'s, the threshold the same
  ``slow_link_gbps``, so every boundary is priced at exactly the codec its link will use. A ratio the
  peers measured on the job (``measured_chain_ratios``) replaces the codec library's estimate.
* ``measured_chain_ratios``: each chain's measured ratio, from the peers' progress records.

Ratios are bytes on the wire per byte of fp16 payload (the cost model's unit); peers report fp32 bytes
per wire byte (``Progress.activation_ratio``), so a measured r prices as 2 / r.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from potluck.compression import get_codec
from potluck.compression.errors import CompressionError
from potluck.coordinator.placement.costmodel import CodecRatios, directed_bandwidth
from potluck.coordinator.placement.netmodel import NetModel
from potluck.protocol.jobspec import CompressionSpec, JobSpec
from potluck.protocol.training import LinkCodecs, Progress, TrainPlan

PROBE_NUMEL = 1 << 16  # elements of the tensor the library's size estimate is asked about
MIN_MEASURED_RATIO = 0.05  # fp32 bytes per wire byte below which a report is not believed (20x bigger)


def chain_problems(comp: CompressionSpec) -> list[str]:
    """A readable line for each codec chain of the job's ``[compression]`` section this release cannot
    build, naming the field; empty when every chain is fine (``potluck launch`` refuses the job
    otherwise, before any peer tries to build it)."""
    fields = {
        "activations": comp.activations,
        "activations_slow": comp.activations_slow,
        "gradients": comp.gradients,
        "outer": comp.outer,
    }
    problems = []
    for name, spec in fields.items():
        if spec is None:
            continue
        try:
            get_codec(spec)
        except CompressionError as e:
            problems.append(f"compression.{name} = {spec!r}: {e}")
    return problems


def estimated_ratio(spec: str) -> float:
    """Wire bytes per fp16 byte of ``spec``, as the codec library estimates them (raises ``SpecError``
    on a chain it cannot build)."""
    return get_codec(spec).estimate_bytes((PROBE_NUMEL,)) / (2.0 * PROBE_NUMEL)


def chain_ratio(spec: str, measured: Mapping[str, float] | None = None, width: float = 1.0) -> float:
    """Wire bytes per fp16 byte of ``spec``: measured on the job if the peers reported it, else estimated
    for a cut ``width`` as wide as d_model (a bottleneck's rank / d_model: fewer numbers cross it; the
    peers' measured ratios count d_model-wide hidden states already, so they are taken as they are)."""
    got = (measured or {}).get(spec)
    if got is not None and got >= MIN_MEASURED_RATIO:
        return 2.0 / got
    return estimated_ratio(spec) * width


def canonical_chain(spec: str) -> str:
    """The spec as the codec writes it in its payload headers (what ``get_codec`` makes of it)."""
    return get_codec(spec).spec


def codec_ratios(
    comp: CompressionSpec, measured: Mapping[str, float] | None = None, width: float = 1.0
) -> CodecRatios:
    """The cost model's per-link-kind ratios for the job's compression section. ``measured``: fp32 bytes
    per wire byte per canonical chain (``measured_chain_ratios``); ``width``: the cut's width over
    d_model (``ModelSpec.boundary_width``: below 1 with a bottleneck)."""
    fast = chain_ratio(canonical_chain(comp.activations), measured, width)
    slow = (
        fast
        if comp.activations_slow is None
        else chain_ratio(canonical_chain(comp.activations_slow), measured, width)
    )
    # Replica syncs: with DiLoCo local steps one sync every ``sync_every`` steps, of the outer codec's
    # payload where the job codes its pseudo-gradients (priced as an all-reduce of it: the all-gather
    # sends each replica's payload to every other one, so beyond two replicas this is optimistic)
    grad = estimated_ratio(comp.outer or comp.gradients) / comp.sync_every
    return CodecRatios(
        fast,
        slow,
        grad,
        grad,
        lan_gbps=comp.slow_link_gbps,
        sync_every=comp.sync_every,
        overlap_sync=comp.outer_overlap,
        overlap_steps=comp.landing_delay(),
    )


def select_link_codecs(
    grid: Sequence[Sequence[int]], net: NetModel, comp: CompressionSpec
) -> LinkCodecs | None:
    """The chains of every boundary link of a placement, ``grid[j][i]`` the ``net`` row of the peer
    running stage j of pipeline i: a direction slower than ``slow_link_gbps`` (``directed_bandwidth``,
    the cost model's own) carries ``activations_slow``, the others ``activations``. None when the job
    has no slow-link chain or no link is slow (every link then uses the job's chain, as older plans)."""
    if comp.activations_slow is None or len(grid) < 2:
        return None
    fast, slow = canonical_chain(comp.activations), canonical_chain(comp.activations_slow)
    if fast == slow:
        return None
    bw = directed_bandwidth(net)
    forward: list[list[int]] = []
    backward: list[list[int]] = []
    for here, there in itertools.pairwise(grid):
        a, b = np.asarray(here, dtype=np.int64), np.asarray(there, dtype=np.int64)
        forward.append((bw[a, b] < comp.slow_link_gbps).astype(np.int64).tolist())  # 1: the slow chain
        backward.append((bw[b, a] < comp.slow_link_gbps).astype(np.int64).tolist())
    if not any(k for row in (*forward, *backward) for k in row):
        return None
    return LinkCodecs(chains=[fast, slow], forward=forward, backward=backward)


def sent_chains(plan: TrainPlan, job: JobSpec, stage: int, replica: int) -> set[str]:
    """The chains the peer at (stage, replica) sends with: activations on to the next stage, their
    gradients back to the previous one."""
    default = canonical_chain(plan.under(job).compression.activations)
    out = set()
    if stage + 1 < len(plan.stages):
        out.add(plan.link_chain(stage, replica, False, default))
    if stage > 0:
        out.add(plan.link_chain(stage - 1, replica, True, default))
    return out


def measured_chain_ratios(plan: TrainPlan, job: JobSpec, records: Iterable[Progress]) -> dict[str, float]:
    """fp32 bytes per wire byte per chain, the median over the peers of ``plan``'s epoch that reported
    one and sent with that chain alone (a peer sending with two chains measured their mix: left out)."""
    seen: dict[str, list[float]] = {}
    for rec in records:
        if rec.job != plan.job or rec.epoch != plan.epoch or rec.activation_ratio is None:
            continue
        if rec.stage >= len(plan.stages) or rec.replica >= plan.n_replicas:
            continue
        if plan.stages[rec.stage].peers[rec.replica] != rec.peer_id:
            continue  # not where the plan placed it: its number describes some other link
        chains = sent_chains(plan, job, rec.stage, rec.replica)
        if len(chains) == 1:
            seen.setdefault(chains.pop(), []).append(rec.activation_ratio)
    return {chain: statistics.median(values) for chain, values in seen.items()}


class MeasuredRatios:
    """The activation chains' ratios measured on the job, kept across plans: a re-plan after a failed
    run still prices links with what earlier epochs measured. The coordinator calls ``update`` with
    its current plan and the progress records of that plan's epoch before it re-plans, and passes the
    result to ``make_train_plan(measured_ratios=...)``."""

    def __init__(self) -> None:
        self.by_chain: dict[str, float] = {}  # canonical chain -> fp32 bytes per wire byte

    def update(self, plan: TrainPlan | None, job: JobSpec, records: Iterable[Progress]) -> dict[str, float]:
        if plan is not None:
            self.by_chain.update(measured_chain_ratios(plan, job, records))
        return dict(self.by_chain)
