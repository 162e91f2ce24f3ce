"""Poisoned gradients from one replica of five, in a real in-process swarm (p2pd on loopback): a NaN
contribution no longer aborts steps, a x100 sign flip no longer steers the model under centered
clipping, and the other replicas' testimony convicts the attacker (coordinator/job/accuse.py)."""

import asyncio
import math

import pytest

from potluck.coordinator.job.accuse import AccuseConfig, hostile_peers
from tests.helpers.training import tiny_job, train_swarm, witness_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STEPS, N = 16, 5
JOB = tiny_job(steps=STEPS, batch={"tokens_per_step": 16 * 10})  # 10 sequences: 2 per replica


def run(tmp_path, aggregation, hostile):
    return asyncio.run(train_swarm(JOB, 1, N, [(0, 4)], tmp_path, aggregation=aggregation, hostile=hostile))


def nan(x):
    x = x.clone()
    x[0] = float("nan")
    return x


def final_loss(reports):
    return reports[(0, 0)][-1].loss


def test_a_nan_sending_replica_costs_no_step_and_is_convicted(tmp_path):
    reports, trainers = run(tmp_path / "nan", "mean", {N - 1: nan})
    assert all(len(r) == STEPS for r in reports.values())  # every step committed (was 0 of 16)
    assert math.isfinite(final_loss(reports))
    attacker = trainers[(0, N - 1)].box.peer_id
    plan = trainers[(0, 0)].plan
    convicted = hostile_peers(plan, witness_records(trainers), AccuseConfig())
    assert [p for p, _ in convicted] == [attacker]


def test_centered_clip_holds_off_a_sign_flip_that_steers_the_mean(tmp_path):
    clean, _ = run(tmp_path / "clean", "mean", {})
    flipped_mean, _ = run(tmp_path / "mean", "mean", {N - 1: lambda x: -100.0 * x})
    flipped_clip, trainers = run(tmp_path / "clip", "centered_clip", {N - 1: lambda x: -100.0 * x})
    base = final_loss(clean)
    assert final_loss(flipped_mean) > base * 1.1  # the attack works on the plain mean...
    assert abs(final_loss(flipped_clip) - base) < 0.05 * base  # ...and not through the robust rule
    convicted = hostile_peers(trainers[(0, 0)].plan, witness_records(trainers), AccuseConfig())
    assert [p for p, _ in convicted] == [trainers[(0, N - 1)].box.peer_id]
