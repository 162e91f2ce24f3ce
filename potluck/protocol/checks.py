"""Which of the trust checks a plan runs (docs/security.md). Peers run them and the coordinator weighs
their testimony, so both read the same rules here. Pure."""

from __future__ import annotations

from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import TrainPlan


def spot_checked(job: JobSpec, plan: TrainPlan) -> bool:
    """Whether the plan's pipeline messages are sealed and spot-checked: a job asking for checks,
    a pipeline to check and replicas to check it, weights equal across replicas (no local steps)."""
    return (
        job.trust.spot_checks > 0
        and len(plan.stages) > 1
        and plan.n_replicas > 1
        and job.compression.sync_every == 1
    )


def audited(job: JobSpec, plan: TrainPlan, stage: int) -> bool:
    """Whether the stage's shard owners are audited: a robust rule (one-hop trees), three replicas
    or more (an owner and two auditors), checks asked for, the strict sync policy without local
    steps (the bucketed all-reduce is what seals its contributions)."""
    return (
        job.trust.spot_checks > 0
        and plan.stages[stage].aggregation != "mean"
        and plan.n_replicas >= 3
        and job.compression.sync_every == 1
        and job.sync.policy == "strict"
    )


def gradients_rechecked(job: JobSpec, plan: TrainPlan, stage: int) -> bool:
    """Whether replicas confirm the contributions their rule finds outlying by recomputing the
    suspect's step (``peer/train/recheck.py``): an audited stage that holds the whole model. Where
    they do, outlying testimony alone convicts nobody; elsewhere it does."""
    return audited(job, plan, stage) and len(plan.stages) == 1
