"""The 1F1B step through host staging, on the CPU, over an in-memory mailbox: the pooled (GPU) path's
buffer handling gives bit-identical losses and gradients to the passthrough, and a send that fails
ends the step with this peer's own error at once instead of a receive timeout blamed on a neighbour."""

import asyncio
import time

import pytest
import torch

from potluck.compression import get_codec
from potluck.model.stage import StageRunner
from potluck.model.staging import Staging
from potluck.net.tags import Round, Tag
from potluck.peer.errors import PipelineError
from potluck.peer.train.pipeline import MicroBatch, Neighbours, Timing, pipeline_step
from potluck.testbed.harness.training import tiny_dataset, tiny_job


class MemBox:
    """Just what pipeline_step uses of a Mailbox: send and recv by (sender, receiver, tag); each message
    arrives ``delay`` seconds after its send (a link's one-way time) and is stamped then."""

    def __init__(
        self,
        me: str,
        wires: dict[tuple[str, str, Tag], asyncio.Future[tuple[bytes, float]]],
        delay: float = 0.0,
    ) -> None:
        self.peer_id, self.wires, self.delay = me, wires, delay

    def _wire(self, src: str, dst: str, tag: Tag) -> asyncio.Future[tuple[bytes, float]]:
        return self.wires.setdefault((src, dst, tag), asyncio.get_running_loop().create_future())

    async def send(self, peer: str, tag: Tag, payload: bytes) -> None:
        wire = self._wire(self.peer_id, peer, tag)
        if self.delay:
            asyncio.get_running_loop().call_later(
                self.delay, lambda: wire.set_result((payload, time.perf_counter()))
            )
        else:
            wire.set_result((payload, time.perf_counter()))

    async def recv(self, peer: str, tag: Tag, timeout_s: float | None = None) -> bytes:
        return (await self.recv_stamped(peer, tag, timeout_s))[0]

    async def recv_stamped(self, peer: str, tag: Tag, timeout_s: float | None = None) -> tuple[bytes, float]:
        return await asyncio.wait_for(asyncio.shield(self._wire(peer, self.peer_id, tag)), timeout_s)


def _micro(job, runner_first: bool, runner_last: bool) -> list[MicroBatch]:
    data = tiny_dataset(job)
    per_step = job.sequences_per_step
    batch = data.replica_batch(0, 0, 1, per_step)
    out = []
    for x, y in data.micro_batches(batch, job.batch.micro_batch_size):
        n = x.shape[0]
        out.append(
            MicroBatch(
                x if runner_first else None,
                y if runner_last else None,
                n / per_step,
                n / per_step,
                (n, x.shape[1]),
            )
        )
    return out


async def _two_stages(
    pooled: bool, codec: str, device: str = "cpu", delay: float = 0.0, timings: list[Timing] | None = None
) -> tuple[float, list[torch.Tensor]]:
    job = tiny_job()
    dev = torch.device(device)
    runners = [
        StageRunner(job.model, 0, 2, job.seed, job.optimizer, dev),
        StageRunner(job.model, 2, 4, job.seed, job.optimizer, dev),
    ]
    for r in runners:
        r.staging = Staging(r.device, pooled=pooled)
    wires: dict = {}
    boxes = [MemBox("a", wires, delay), MemBox("b", wires, delay)]
    timings = [Timing(), Timing()] if timings is None else timings
    wheres = [Neighbours(0, 2, None, "b"), Neighbours(1, 2, "a", None)]
    rnd = Round(1, 0)
    losses = await asyncio.gather(
        *(
            pipeline_step(box, r, w, _micro(job, r.is_first, r.is_last), rnd, get_codec(codec), 30.0, t)
            for box, r, w, t in zip(boxes, runners, wheres, timings, strict=True)
        )
    )
    if pooled:  # every buffer went back: one per (size, dtype) in use at once, never one per message
        for r in runners:
            assert r.staging.pool.allocated <= 3 and not r.staging._lent
    return losses[1], [r.grad_vector().cpu() for r in runners]


@pytest.mark.parametrize("codec", ["none", "int8:block=64"])
def test_pooled_staging_gives_the_passthrough_bits(codec):
    plain_loss, plain_grads = asyncio.run(_two_stages(False, codec))
    pooled_loss, pooled_grads = asyncio.run(_two_stages(True, codec))
    assert pooled_loss == plain_loss and plain_loss > 0
    for a, b in zip(plain_grads, pooled_grads, strict=True):
        assert torch.equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_pipeline_in_bf16_follows_the_cpu_in_fp32():
    cpu_loss, cpu_grads = asyncio.run(_two_stages(False, "int8:block=64"))
    gpu_loss, gpu_grads = asyncio.run(_two_stages(True, "int8:block=64", "cuda"))
    assert gpu_loss == pytest.approx(cpu_loss, rel=2e-2)
    for a, b in zip(cpu_grads, gpu_grads, strict=True):
        assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.98


def test_a_failed_send_ends_the_step_at_once_with_its_own_error():
    job = tiny_job()
    runner = StageRunner(job.model, 0, 2, job.seed, job.optimizer)
    with torch.no_grad():
        runner.model.embed.weight.fill_(float("nan"))  # its activations cannot be encoded

    async def run() -> None:
        box = MemBox("a", {})
        micro = _micro(job, True, False)
        await pipeline_step(
            box, runner, Neighbours(0, 2, None, "b"), micro, Round(1, 0), get_codec("int8"), 60.0, Timing()
        )

    t0 = time.perf_counter()
    with pytest.raises(PipelineError, match=r"NaN|Inf|finite"):
        asyncio.run(run())
    assert time.perf_counter() - t0 < 20.0  # not the 60 s receive timeout


def test_a_boundarys_round_trip_less_its_hold_is_the_two_messages_cost():
    """The message-cost figures the step model is calibrated with (Timing.round_trips, .holds): over a
    link with a 30 ms one-way delay, the first stage's round trip less the second's hold is both
    messages' transit, whatever either stage computed or queued meanwhile."""
    timings = [Timing(), Timing()]
    asyncio.run(_two_stages(False, "int8:block=64", delay=0.03, timings=timings))
    first, last = timings
    n = len(_micro(tiny_job(), True, False))
    assert len(first.round_trips) == n and len(last.holds) == n and not first.holds and not last.round_trips
    one_way = [(rt - hold) / 2 for rt, hold in zip(first.round_trips, last.holds, strict=True)]
    # the delay, plus each side's encode and decode of a tiny tensor (and this box's scheduling)
    assert all(0.03 <= w < 0.06 for w in one_way), one_way
    _, parts = first.report()
    assert parts.round_trip == pytest.approx(sum(first.round_trips) / n) and parts.hold == 0.0
