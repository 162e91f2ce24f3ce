"""The worker publishes a "failed" Progress for ANY error that ends training, with the reason, and logs
the traceback of an unexpected one, so the coordinator re-plans instead of the swarm waiting out a
step timeout.

A fake swarm node stands in for ``net.node.SwarmNode`` (its fetch and publish, and a p2p handle with
a peer id): a real one needs p2pd processes, which belong in the integration tests. Everything else is
real: the worker's poll loop and supervisor, the signed-plan records, the dataset, and a real Trainer
training a one-stage, one-replica plan until the injected error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hivemind.p2p import PeerID

from potluck.peer import worker as worker_mod
from potluck.peer.config import WorkerConfig
from potluck.peer.errors import StepAborted
from potluck.peer.train.trainer import StepReport, Trainer
from potluck.peer.worker import PlanWorker, failure_reason
from potluck.protocol.allocation import Allocation
from potluck.protocol.envelope import Verified
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import ALLOCATION, JOB, PLAN, PROGRESS
from potluck.protocol.records import Record
from potluck.protocol.training import Progress, StageAssignment, TrainPlan


class FakeNode:
    """fetch() serves the given records; publish() keeps what the worker publishes."""

    def __init__(self, peer_id: str, records: dict[str, list[Record]]) -> None:
        self.p2p = SimpleNamespace(
            peer_id=PeerID.from_base58(peer_id),
            add_binary_stream_handler=_nothing,
            remove_binary_stream_handler=_nothing,
        )
        self.records = records
        self.published: list[Progress] = []
        self.policy = SimpleNamespace(banned=set(), require_admission=False)  # as the daemon reads it
        self.admission = None

    async def fetch(self, name: str) -> list[Verified]:
        return [Verified(name, None, r, b"k" * 32, time.time() + 60) for r in self.records.get(name, [])]

    async def read_allocation(self) -> Allocation | None:
        found = [r for r in self.records.get(ALLOCATION.name, []) if isinstance(r, Allocation)]
        return max(found, key=lambda r: (r.round, r.issued_at), default=None)

    async def publish(self, name: str, record: Record, ttl_s: float, subkey: Any = None) -> bool:
        assert name == PROGRESS.name and isinstance(record, Progress)
        self.published.append(record)
        return True

    async def take_pushes(self, names: Any, on_record: Any) -> None:
        return None  # plans come from fetch() here

    async def stop_pushes(self) -> None:
        return None


async def _nothing(*args: object) -> None:
    return None


def _job(tmp_path) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "worker-test",
            "seed": 1,
            "steps": 6,
            "min_peers": 1,
            "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "vocab_size": 256, "seq_len": 16},
            "batch": {"tokens_per_step": 64, "micro_batch_size": 2},
            "data": {"generated_chars": 20_000},
            "compression": {"activations": "none", "gradients": "none", "error_feedback": False},
            "checkpoint": {"dir": str(tmp_path / "ckpt"), "interval": 100},
        }
    )


def _failing_trainer(error: BaseException, after_steps: int) -> type[Trainer]:
    class FailingTrainer(Trainer):
        async def train_step(self, timeout_s: float | None = None) -> StepReport:
            if self.step >= after_steps:
                raise error
            return await super().train_step()

    return FailingTrainer


async def _run_until_failed(node: FakeNode, cfg: WorkerConfig, peer_id: str) -> list[Progress]:
    worker = PlanWorker(node, peer_id, "swarm-w", cfg)  # type: ignore[arg-type]
    task = asyncio.create_task(worker.run())
    try:
        for _ in range(600):  # 30 s at most
            if any(p.state == "failed" for p in node.published) or task.done():
                break
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.wait({task})
    assert not task.done() or task.cancelled(), task.exception()
    return node.published


def _one_peer_swarm(peer: str, job, epoch: int) -> FakeNode:
    """A swarm whose plan puts this one peer on the whole (2-layer) model."""
    plan = TrainPlan(
        job=job.name,
        epoch=epoch,
        start_step=0,
        micro_batches=2,
        issued_at=time.time(),
        stages=[StageAssignment(first_layer=0, last_layer=2, peers=[peer])],
    )
    return FakeNode(peer, {PLAN.name: [plan], JOB.name: [job]})


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (KeyError("lost-layer"), "KeyError: 'lost-layer'"),
        (torch.cuda.OutOfMemoryError("CUDA out of memory. " + "x" * 300), "OutOfMemoryError: CUDA out of"),
    ],
)
def test_an_unexpected_error_is_published_as_failed_and_logged(tmp_path, monkeypatch, caplog, error, reason):
    peer = Identity.generate().peer_id
    job = _job(tmp_path)
    node = _one_peer_swarm(peer, job, epoch=1)
    monkeypatch.setattr(worker_mod, "Trainer", _failing_trainer(error, after_steps=2))
    cfg = WorkerConfig(plan_poll_s=0.05, progress_interval_s=0.0, checkpoint_root=tmp_path / "ckpt")

    with caplog.at_level(logging.INFO, logger="potluck.peer.worker"):
        published = asyncio.run(_run_until_failed(node, cfg, peer))

    failed = [p for p in published if p.state == "failed"]
    assert len(failed) == 1, published
    assert failed[0].step == 2 and failed[0].epoch == 1 and failed[0].peer_id == peer
    assert failed[0].message.startswith(reason) and len(failed[0].message) <= 128
    # It said it holds the plan's start (before step 1), then trained two steps before failing.
    training = [p for p in published if p.state == "training"]
    assert [p.step for p in training] == [0, 1, 2]
    [logged] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "epoch 1" in logged.getMessage() and logged.exc_info is not None and logged.exc_info[1] is error


def test_an_expected_error_is_published_without_a_traceback(tmp_path, monkeypatch, caplog):
    peer = Identity.generate().peer_id
    job = _job(tmp_path)
    node = _one_peer_swarm(peer, job, epoch=3)
    monkeypatch.setattr(worker_mod, "Trainer", _failing_trainer(StepAborted("peer X left"), after_steps=0))
    cfg = WorkerConfig(plan_poll_s=0.05, progress_interval_s=0.0, checkpoint_root=tmp_path / "ckpt")

    with caplog.at_level(logging.INFO, logger="potluck.peer.worker"):
        published = asyncio.run(_run_until_failed(node, cfg, peer))

    [failed] = [p for p in published if p.state == "failed"]
    assert failed.message == "peer X left" and failed.step == 0 and failed.epoch == 3
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_failure_reason_is_type_and_message_cut_to_a_record():
    assert failure_reason(KeyError("x")) == "KeyError: 'x'"
    assert failure_reason(RuntimeError()) == "RuntimeError"
    assert len(failure_reason(ValueError("y" * 1000))) == 128


def _slow_trainer(delay_s: float) -> type[Trainer]:
    class SlowTrainer(Trainer):
        async def train_step(self, timeout_s: float | None = None) -> StepReport:
            await asyncio.sleep(delay_s)  # time for the test to re-publish the plan mid-run
            return await super().train_step()

    return SlowTrainer


async def _pause_mid_run(node: FakeNode, cfg: WorkerConfig, peer_id: str, stop_at: int) -> list[Progress]:
    """Run the worker; once it reported a step, re-publish its plan's epoch with ``stop_at``; return what
    it published once it said it waits (or after 30 s)."""
    worker = PlanWorker(node, peer_id, "swarm-w", cfg)  # type: ignore[arg-type]
    task = asyncio.create_task(worker.run())
    try:
        for _ in range(600):
            if any(p.state == "training" and p.step >= 1 for p in node.published):
                break
            await asyncio.sleep(0.05)
        [plan] = node.records[PLAN.name]
        assert isinstance(plan, TrainPlan)
        paused = plan.model_copy(update={"stop_at": stop_at, "issued_at": plan.issued_at + 1.0})
        node.records[PLAN.name] = [paused]
        for _ in range(600):
            if any(p.state in ("waiting", "done", "failed") for p in node.published) or task.done():
                break
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.wait({task})
    return node.published


def test_a_plan_re_published_with_a_pause_stops_the_run_there_with_a_checkpoint(tmp_path, monkeypatch):
    peer = Identity.generate().peer_id
    job = _job(tmp_path)  # 6 steps, checkpoints every 100: only the pause writes one
    node = _one_peer_swarm(peer, job, epoch=1)
    monkeypatch.setattr(worker_mod, "Trainer", _slow_trainer(0.3))
    cfg = WorkerConfig(plan_poll_s=0.05, progress_interval_s=0.0, checkpoint_root=tmp_path / "ckpt")

    published = asyncio.run(_pause_mid_run(node, cfg, peer, stop_at=4))

    assert not [p for p in published if p.state in ("done", "failed")], published
    [waiting] = [p for p in published if p.state == "waiting"]
    assert waiting.step == 4 and waiting.message.startswith("paused at step 4"), waiting
    assert max(p.step for p in published) == 4  # no step past the pause
    assert [h.step for h in waiting.stored] == [4]  # the pause's checkpoint, on this peer's disk
