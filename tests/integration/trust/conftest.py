"""The trust tests' shared swarm: one honest in-process swarm, trained once per session, that the audit
tests and the gradient-check tests both read (p2pd on loopback).

1 stage x 5 replicas under centered clipping, int8 gradients with error feedback, and
``trust.spot_checks = 1``: every replica audits every chunk it may and recomputes another replica's step
each step, so one short run exercises every honest check at once (audits: ``test_audits.py``; gradient
checks: ``test_poisoning.py``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from potluck.peer.train.trainer import StepReport, Trainer
from potluck.protocol.jobspec import JobSpec
from potluck.testbed.harness.training import tiny_job, train_swarm

HONEST_N = 5
HONEST_JOB = tiny_job(
    steps=10,
    batch={"tokens_per_step": 16 * 10},  # 10 sequences: 2 per replica
    compression={"gradients": "int8:block=64", "error_feedback": True},
    trust={"spot_checks": 1.0},
)


@dataclass(frozen=True)
class Trained:
    """A finished in-process swarm: its job, per-(stage, replica) step reports and trainers."""

    job: JobSpec
    n: int
    reports: dict[tuple[int, int], list[StepReport]]
    trainers: dict[tuple[int, int], Trainer]


@pytest.fixture(scope="session")
def honest_swarm(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    root = tmp_path_factory.mktemp("honest")
    reports, trainers = asyncio.run(
        train_swarm(HONEST_JOB, 1, HONEST_N, [(0, 4)], root, aggregation="centered_clip")
    )
    return Trained(HONEST_JOB, HONEST_N, reports, trainers)
