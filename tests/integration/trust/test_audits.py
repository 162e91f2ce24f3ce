"""Audits of shard owners in a real in-process swarm (p2pd on loopback, 1 stage x 4 replicas under
centered clipping): an owner that broadcasts a wrong aggregate for its shard, and one that withholds
the evidence of its aggregation, are each caught by the auditors and convicted; honest owners pass
every audit, read from the trust tests' shared honest swarm (conftest.py: 1 x 5, int8 gradients)
(peer/train/checks/audit.py, coordinator/job/accuse.py)."""

import asyncio

import pytest

from potluck.coordinator.job.accuse import AccuseConfig, hostile_peers
from potluck.peer.collectives import tree
from potluck.peer.collectives.robust import Combined
from potluck.peer.config import TrainerConfig
from potluck.peer.train.checks.audit import ShardAudits
from potluck.testbed.harness.training import tiny_job, train_swarm, witness_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STEPS, N = 10, 4
# half of all chunks audited, so every owner is audited a few times in a short run (the default is 1%)
JOB = tiny_job(steps=STEPS, batch={"tokens_per_step": 16 * 8}, trust={"spot_checks": 0.5})


def convicted(trainers):
    plan = trainers[(0, 0)].plan
    return [p for p, _ in hostile_peers(plan, witness_records(trainers), AccuseConfig())]


def test_an_owner_broadcasting_a_wrong_aggregate_is_convicted(tmp_path, monkeypatch):
    liar: list[str] = []  # filled once the peers exist: replica N - 1
    honest_combine = tree.combine

    def lying(stack, who, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = honest_combine(stack, who, *args, **kwargs)
        if liar and who[0] == liar[0]:  # the owner is always the first row
            return Combined(-3.0 * out.result, out.refused, out.clipped)
        return out

    monkeypatch.setattr(tree, "combine", lying)

    def pick(trainers):  # type: ignore[no-untyped-def]
        liar.append(trainers[(0, N - 1)].box.peer_id)

    reports, trainers = asyncio.run(
        train_swarm(JOB, 1, N, [(0, 4)], tmp_path, aggregation="centered_clip", setup=pick)
    )
    assert all(len(r) == STEPS for r in reports.values())
    assert convicted(trainers) == liar
    for tr in trainers.values():
        assert all(tr.audit.failed[p] == 0 for p in tr.audit.checked if p != liar[0])


def test_an_owner_withholding_its_evidence_is_convicted(tmp_path, monkeypatch):
    liar: list[str] = []
    serve = ShardAudits._serve

    def withholding(self, rnd, check):  # type: ignore[no-untyped-def]
        if self.me not in liar:
            serve(self, rnd, check)

    monkeypatch.setattr(ShardAudits, "_serve", withholding)
    job = JOB.model_copy(update={"steps": 30})  # the auditors' waits end while it trains on
    reports, trainers = asyncio.run(
        train_swarm(
            job,
            1,
            N,
            [(0, 4)],
            tmp_path,
            aggregation="centered_clip",
            cfg=TrainerConfig(step_timeout_s=60, evidence_timeout_s=1.0),
            setup=lambda trs: liar.append(trs[(0, 1)].box.peer_id),
        )
    )
    assert all(len(r) == job.steps for r in reports.values())
    assert convicted(trainers) == liar


def test_honest_owners_pass_every_audit(honest_swarm):
    """The shared honest swarm (conftest.py: 1 x 5, every chunk audited, int8 gradients)."""
    reports, trainers = honest_swarm.reports, honest_swarm.trainers
    assert all(len(r) == honest_swarm.job.steps for r in reports.values())
    checked = sum(sum(tr.audit.checked.values()) for tr in trainers.values())
    assert checked >= 10
    assert all(sum(tr.audit.failed.values()) == 0 for tr in trainers.values())
    assert all(sum(tr.audit.withheld.values()) == 0 for tr in trainers.values())
    assert convicted(trainers) == []
