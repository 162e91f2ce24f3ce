"""The reference setup: the job, planner limits, churn trace and population every figure uses.

The job is a 350M-parameter decoder (24 layers, d 1024, 1024-token sequences) trained with 4M-token
steps, int4 activations and int2 gradients on WAN links: a job home links can carry at all (with
fp16 gradients a single A100 beats any data-parallel group of home peers). The planner may use up to 8
stages and 24 replicas; repairs get 0.1 s of local moves (the default 0.6 s would be the larger part
of a decision), fresh searches 1 s. Sessions follow ``churn.REFERENCE``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from potluck.coordinator.placement import PlannerConfig
from potluck.coordinator.placement.costmodel import BatchSpec, CodecRatios, ModelShape, StepJob
from potluck.sim.churn import REFERENCE, ChurnModel, Trace, make_trace
from potluck.sim.population import Population, make_population

JOB = StepJob(
    ModelShape(layers=24, d_model=1024, heads=16, vocab=50257, seq_len=1024),
    BatchSpec(sequences_per_step=4096, micro_batch=4),
    CodecRatios(activation_lan=0.5, activation_wan=0.25, gradient_lan=0.125, gradient_wan=0.125),
)
PLANNER = PlannerConfig(time_limit_s=1.0, max_stages=8, max_replicas=24, repair_time_limit_s=0.1)
FRESH = PlannerConfig(time_limit_s=1.0, max_stages=8, max_replicas=24)


@dataclass(frozen=True)
class Setup:
    pop: Population
    trace: Trace
    job: StepJob
    planner: PlannerConfig
    fresh: PlannerConfig


def reference(peers: int, hours: float, seed: int = 1, churn: ChurnModel = REFERENCE) -> Setup:
    """~`peers` live volunteers over `hours`; the trace and the population each have their own stream."""
    trace = make_trace(peers, hours, churn, np.random.default_rng((seed, 1)))
    pop = make_population(trace.identities, np.random.default_rng((seed, 2)))
    return Setup(pop, trace, JOB, PLANNER, FRESH)
