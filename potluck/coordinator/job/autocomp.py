"""``compression = "auto"``: the settings a plan runs with, chosen from the measured links. Pure.

A job file without a ``[compression]`` section asks the coordinator to choose (``CompressionSpec.auto``).
A user who does not know which codec their links need should get what a tuned job gets, and on links
fast enough to need nothing, nothing. The coordinator prices the plan it found under each rung of a
ladder, from the most faithful setting to the most compressed, with the same step-time model that
placed it, and takes the most faithful rung whose predicted step is within ``TOLERANCE`` of the fastest:
compression is bought only where it pays for itself in step time. Local steps (which change the
optimisation, not only the bytes) must pay more: ``LOCAL_STEPS_GAIN``.

Every rung is a setting a benchmark trained to the baseline's loss (docs/benchmarks.md):

* ``lossless``: no codec at all (exact activations and gradients), only where every link between the
  plan's peers measures at least ``LOSSLESS_GBPS``: it sends 4x int8's bytes, and every byte costs host
  CPU (the daemon's encryption, framing) that the step-time model does not count. On the 2-core
  benchmark bridge (links measured at 0.8-1 Gbit/s) the model found lossless and int8 equal, and the
  two ran alike (5,850 and 5,780 tokens/s): 4x the bytes for nothing measurable.
* ``int8``: 8-bit activations and gradients (the fixed default before "auto").
* ``int4 on slow links``: int8, and 4-bit activations over every direction slower than ``SLOW_GBPS``
  (a home or WAN link, not a LAN; issue 22's per-link codecs). Whether that pays is the step model's
  call, like every rung's. (A threshold from the predicted compute per micro-batch was tried first: from
  the start-up probes it put home uplinks of 5-10 Mbit/s on the fast side, while their activations
  were 0.5-1.1 s of a 2.45 s step.)
* ``4 local steps``: that, with 4 inner steps between replica syncs whose outer step averages the
  replicas (outer lr 1, no momentum: local SGD). On the bench_wan home links (docs/benchmarks/wan.md,
  2026-12-07) it reached 0.630 at 5,922 tokens/s, below hivemind's 0.661 and level with the bridge's 0.640
  without local steps; DiLoCo's own outer step (lr 0.7, Nesterov 0.9) ended at 0.792 at 4 inner steps.
* ``16 local steps, 2-bit outer``: that, with 16 inner steps and pseudo-gradients coded at 2 bits with
  error feedback, outer lr 0.8 (issue 22: 546x fewer bytes than fp32 data parallelism, +0.23% loss
  at the worst of three seeds).

A rung the job's other sections rule out (``sync.policy = "deadline"`` needs a coded outer sync with
local steps; ``trust.aggregation = "centered_clip"`` rules the coded outer sync out) is skipped. A
running job keeps the rung its first plan chose: local steps and the outer momentum are state the
replicas carry, and the per-link codecs still follow the links at every re-plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from potluck.protocol.jobspec import CompressionSpec, JobSpec

TOLERANCE = 1.10  # a more faithful rung is kept while its predicted step is within 10% of the fastest
LOCAL_STEPS_GAIN = 1.25  # local steps only for a step at least this many times faster than without
SLOW_ACTIVATIONS = "int4:block=64"  # issue 15's tuned home-links codec, on slow directions only
OUTER = "int2:block=512|zstd"  # issue 22's coded pseudo-gradients
LOCAL_4 = {"sync_every": 4, "outer_lr": 1.0, "outer_momentum": 0.0}  # 4 inner steps, then the replicas' mean
SLOW_GBPS = 1.0  # directions slower than this (Gbit/s) are home or WAN links: int4 on them, if it pays
LOSSLESS_GBPS = 10.0  # the slowest measured link (Gbit/s) at which no codec at all is a candidate


@dataclass(frozen=True)
class Rung:
    name: str
    spec: CompressionSpec


def ladder(slow_gbps: float = SLOW_GBPS) -> list[Rung]:
    """The rungs, most faithful first (the module's docstring says where each was measured)."""
    slow = CompressionSpec(activations_slow=SLOW_ACTIVATIONS, slow_link_gbps=slow_gbps)
    named = f"int8, int4 under {slow_gbps:g} Gbit/s"
    return [
        Rung("lossless", CompressionSpec(activations="none", gradients="none", error_feedback=False)),
        Rung("int8", CompressionSpec()),
        Rung(named, slow),
        Rung(f"{named}, 4 local steps", slow.model_copy(update=LOCAL_4)),
        Rung(
            f"{named}, 16 local steps, 2-bit outer",
            slow.model_copy(update={"sync_every": 16, "outer": OUTER, "outer_lr": 0.8}),
        ),
    ]


def allowed(job: JobSpec, rungs: Sequence[Rung]) -> list[Rung]:
    """The rungs the job's other sections allow (its validators say which combinations run)."""
    out = []
    for rung in rungs:
        try:
            JobSpec.model_validate({**job.model_dump(), "compression": rung.spec.model_dump()})
        except ValidationError:
            continue
        out.append(rung)
    return out


def choose(priced: Sequence[tuple[Rung, float]]) -> tuple[Rung, str]:
    """The most faithful rung whose predicted step (s) is within ``TOLERANCE`` of the fastest, and a
    line for the plan table: what it chose, and the steps it predicts for the others. Local steps change
    the optimisation itself (+11% loss against a tuned baseline in issue 22's measurements), so rungs
    with them are considered only when they are ``LOCAL_STEPS_GAIN`` times faster than every rung
    without."""
    exact = [(r, t) for r, t in priced if r.spec.sync_every == 1]
    local = [(r, t) for r, t in priced if r.spec.sync_every > 1]
    pool = exact or local
    if exact and local and LOCAL_STEPS_GAIN * min(t for _, t in local) <= min(t for _, t in exact):
        pool = local
    fastest = min(t for _, t in pool)
    rung, seconds = next((r, t) for r, t in pool if t <= TOLERANCE * fastest)
    others = "; ".join(f"{r.name} {t:.3g} s" for r, t in priced if r is not rung)
    return rung, f"compression auto: {rung.name} ({seconds:.3g} s a step predicted; {others})"


def pick(
    job: JobSpec, slowest_gbps: float, price: Callable[[CompressionSpec], float]
) -> tuple[CompressionSpec, str]:
    """The chosen settings for ``job`` and why: each allowed rung priced by ``price`` (the predicted
    step, s, of the plan found, run with those settings); ``slowest_gbps``: the slowest link measured
    between the plan's peers (lossless only from ``LOSSLESS_GBPS``)."""
    rungs = allowed(job, ladder())
    if slowest_gbps < LOSSLESS_GBPS:
        rungs = [r for r in rungs if r.spec.activations != "none"]
    rung, why = choose([(r, price(r.spec)) for r in rungs])
    return rung.spec, why
