"""The worker keeps its stage's state when a training run ends, ready to serve (fake node, no daemon)."""

import asyncio

from potluck.peer.config import WorkerConfig
from potluck.peer.worker import PlanWorker
from potluck.protocol.identity import Identity
from tests.unit.peer.test_worker import _job, _one_peer_swarm


def test_a_finished_run_leaves_its_state_offered(tmp_path):
    identity = Identity.generate()
    peer = identity.peer_id
    job = _job(tmp_path)
    node = _one_peer_swarm(peer, job, epoch=1)
    cfg = WorkerConfig(plan_poll_s=0.05, progress_interval_s=0.0, checkpoint_root=tmp_path / "ckpt")

    async def main() -> PlanWorker:
        worker = PlanWorker(node, peer, "swarm-w", cfg, identity=identity)  # type: ignore[arg-type]
        task = asyncio.create_task(worker.run())
        try:
            for _ in range(600):  # 30 s at most
                if any(p.state in ("done", "failed") for p in node.published):
                    break
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
            await asyncio.wait({task})
        return worker

    worker = asyncio.run(main())
    assert [p.state for p in node.published][-1] == "done"
    assert worker.state is not None and worker.state.offered is not None
    held = worker.state.offered
    assert (held.meta.job, held.step, held.meta.epoch) == (job.name, job.steps, 1)
    assert any(k.endswith(".exp_avg_sq") for k in held.tensors)


def test_without_an_identity_the_worker_serves_nothing(tmp_path):
    peer = Identity.generate().peer_id
    node = _one_peer_swarm(peer, _job(tmp_path), epoch=1)
    worker = PlanWorker(node, peer, "swarm-w", WorkerConfig(checkpoint_root=tmp_path))  # type: ignore[arg-type]
    assert worker.state is None
