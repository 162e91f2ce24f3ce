"""Which checkpoints the job owner's copy takes: those written under the current plan, and the job's
last one even when a hand-off plan starts exactly there (a fast swarm reaches the end while a peer
leaves; the copy of the final step was skipped, and the owner was left without it)."""

from __future__ import annotations

from pathlib import Path

from potluck.coordinator.copies import CheckpointCopier
from potluck.protocol.identity import Identity
from potluck.protocol.training import StageAssignment, TrainPlan
from potluck.testbed.harness.training import tiny_job
from potluck.transfer.server import TransferConfig

PEERS = sorted(Identity.generate().peer_id for _ in range(2))


def plan(start: int, epoch: int = 2) -> TrainPlan:
    stages = [
        StageAssignment(first_layer=0, last_layer=2, peers=PEERS[:1]),
        StageAssignment(first_layer=2, last_layer=4, peers=PEERS[1:]),
    ]
    return TrainPlan(
        job="tiny-test", epoch=epoch, start_step=start, stages=stages, micro_batches=2, issued_at=1.0
    )


def copier(tmp_path: Path) -> CheckpointCopier:
    return CheckpointCopier(None, "s", tiny_job(steps=80), tmp_path, TransferConfig())  # type: ignore[arg-type]


def test_checkpoints_of_the_current_plan_are_copied_and_older_ones_are_not(tmp_path):
    c = copier(tmp_path)
    assert c.want(plan(start=40), 60)
    assert not c.want(plan(start=60), 60)  # written under the plan before: its layers may differ
    assert not c.want(plan(start=60), 40)


def test_the_last_checkpoint_is_copied_under_a_plan_that_starts_at_the_end(tmp_path):
    c = copier(tmp_path)
    assert c.want(plan(start=80), 80)
    c.copied = 80
    assert not c.want(plan(start=80), 80)  # once
