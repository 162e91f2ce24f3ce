"""Poisoned gradients from one replica of five, in a real in-process swarm (p2pd on loopback): a NaN
contribution no longer aborts steps, a x100 sign flip no longer steers the model under centered
clipping, and the other replicas' testimony convicts the attacker (coordinator/job/accuse.py)."""

import asyncio
import math

import pytest

from potluck.coordinator.job.accuse import AccuseConfig, hostile_peers
from potluck.testbed.harness.training import tiny_job, train_swarm, witness_records

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
    attacker = trainers[(0, N - 1)].box.peer_id
    records = witness_records(trainers)
    convicted = hostile_peers(trainers[(0, 0)].plan, records, AccuseConfig())
    assert [p for p, _ in convicted] == [attacker]
    # The replicas that clipped it recomputed its step (peer/train/checks/recheck.py): every check of the
    # attacker failed, none of an honest peer did, and the recomputation alone convicts it.
    failed = {(r.peer_id, w.peer_id): (w.checked, w.failed) for r in records for w in r.witnessed}
    caught = [k for k, (checked, bad) in failed.items() if k[1] == attacker and bad]
    assert len(caught) >= 2, failed
    assert all(bad == 0 for (_, accused), (_, bad) in failed.items() if accused != attacker), failed
    confirmed = hostile_peers(trainers[(0, 0)].plan, records, AccuseConfig(), rechecked=[0])
    assert [p for p, _ in confirmed] == [attacker]


def test_honest_replicas_pass_every_gradient_check(honest_swarm):
    """With every replica recomputing another's step at every step (``trust.spot_checks = 1``), int8
    gradients and error feedback, no honest contribution fails: the allowance covers the codec twice and
    the residual error feedback carries, so the checks cost honest peers nothing but compute. The run is
    the trust tests' shared honest swarm (conftest.py)."""
    trainers = honest_swarm.trainers
    assert honest_swarm.job.trust.spot_checks == 1.0 and honest_swarm.job.compression.error_feedback
    duties = [tr.rechecks for tr in trainers.values()]
    assert all(d is not None and d.crashed == 0 for d in duties)
    done = sum(d.done for d in duties if d is not None)
    # each replica recomputed others' steps (one check in flight at a time)
    assert done >= honest_swarm.n, done
    assert sum(d.failed for d in duties if d is not None) == 0
    assert sum(tr.audit.failed.total() for tr in trainers.values()) == 0
