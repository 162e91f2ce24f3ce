"""One training step of one pipeline stage: the 1F1B schedule over the mailbox.

Replica i of stage j receives activations from replica i of stage j - 1 and sends its own to replica i
of stage j + 1; activation gradients travel the other way. Messages are tagged with the step's round
and the micro-batch index (``net/tags.py``), so the order in which the network delivers them does not
matter. Compute runs in a worker thread (``asyncio.to_thread``) so the event loop keeps serving the
transport, heartbeats and the other stages' messages while this stage multiplies matrices; sends are
started as tasks (encoding in a worker thread) so the next micro-batch's compute overlaps the encode
and transfer of the previous one. On a GPU, tensors cross to the host through pinned buffers on a side
stream (``model/staging.py``) and the step syncs with the device only where a value is needed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from potluck.compression import Codec, all_finite, get_codec
from potluck.compression.errors import CompressionError
from potluck.model.stage import StageRunner
from potluck.model.staging import Outgoing
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Round, Stream, Tag, make_tag
from potluck.peer.errors import NeighbourError, PipelineError
from potluck.peer.seal import Ledger
from potluck.peer.train.schedule import one_f_one_b
from potluck.protocol.errors import WireError
from potluck.protocol.training import StepTiming, TrainPlan

T = TypeVar("T")


@dataclass(frozen=True)
class Neighbours:
    """Where this peer sits in its pipeline."""

    stage: int
    n_stages: int
    prev: str | None  # the peer running stage - 1 of this replica (None on the first stage)
    next: str | None


@dataclass(frozen=True)
class MicroBatch:
    # token ids: on the first stage its input, on a stage that re-embeds them at a bottleneck
    # (StageRunner.needs_tokens) a side input each peer reads from its own copy of the data; else None
    inputs: torch.Tensor | None
    targets: torch.Tensor | None  # next-token ids (last stage only)
    weight: float  # gradient scale: share of the batch this replica's gradient averages over
    share: float  # loss scale: share of the global batch (the reported loss sums these)
    # (sequences, tokens) of the hidden states (or bottleneck codes) crossing a stage boundary, both
    # ways; with the cut's width, what a neighbour's payload must decode to, checked before anything is
    # decompressed or allocated
    rows: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class PipeCodecs:
    """The codecs of this peer's two pipeline links, by direction: a plan may code each link, and each
    direction of it, with its own chain (``TrainPlan.link_codecs``); the receiver decodes strictly with
    the chain the sender used, so both ends read it from the same signed plan."""

    acts_in: Codec  # activations from the previous stage
    acts_out: Codec  # activations to the next stage
    grads_in: Codec  # activation gradients from the next stage
    grads_out: Codec  # activation gradients back to the previous stage

    @classmethod
    def same(cls, codec: Codec) -> PipeCodecs:
        return cls(codec, codec, codec, codec)


def link_codecs(plan: TrainPlan, stage: int, replica: int, default: str) -> PipeCodecs:
    """The codecs of (stage, replica)'s links under ``plan``; ``default``: the job's activation chain.
    Raises ``SpecError`` (a ``CompressionError``) on a chain this peer cannot build."""
    built: dict[str, Codec] = {}

    def codec(boundary: int, backward: bool) -> Codec:
        spec = plan.link_chain(boundary, replica, backward, default) if boundary >= 0 else default
        if spec not in built:
            built[spec] = get_codec(spec)
        return built[spec]

    last = len(plan.stages) - 1
    nxt = stage if stage < last else -1  # the first and last stage have one link: -1 stands for none
    return PipeCodecs(codec(stage - 1, False), codec(nxt, False), codec(nxt, True), codec(stage - 1, True))


@dataclass
class Timing:
    """Seconds spent in each part of a step, accumulated by the executor."""

    compute: float = 0.0
    send: float = 0.0
    recv: float = 0.0
    allreduce: float = 0.0
    commit: float = 0.0
    piped: float = 0.0
    bytes_sent: int = 0
    # Activations and their gradients crossing stage boundaries: fp32 bytes before the codec, and after
    wire_raw: int = 0
    wire_coded: int = 0
    # A pipeline message's cost under load, in two halves that only meet at the coordinator: on each
    # micro-batch, the time from handing its activations to the send to having its gradient decoded
    # (stages with a next), and the time from its activations arriving decoded to handing its gradient
    # to the send (stages with a previous). A boundary's round trip less its downstream's hold is both
    # messages' encode, transit and decode: what the step model's link term must price (seconds).
    round_trips: list[float] = field(default_factory=list)
    holds: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def report(self) -> tuple[float, StepTiming]:
        """The step's wall seconds so far and its breakdown; idle is what compute, sends, receives and
        the all-reduce leave of it."""
        total = time.perf_counter() - self.started
        busy = self.compute + self.send + self.recv + self.allreduce
        parts = StepTiming(
            compute=self.compute,
            send=self.send,
            recv=self.recv,
            allreduce=self.allreduce,
            idle=max(0.0, total - busy),
            total=total,
            round_trip=_mean(self.round_trips),
            hold=_mean(self.holds),
        )
        return total, parts

    def line(self, total: float, parts: StepTiming) -> str:
        """The step's breakdown for a log line (seconds)."""
        return (
            f"{total:.3f} s; pipeline done at {self.piped:.3f}, commit {self.commit:.3f}, compute "
            f"{parts.compute:.3f}, receive {parts.recv:.3f}, send {parts.send:.3f}, "
            f"all-reduce {parts.allreduce:.3f}"
        )


def _mean(values: list[float]) -> float:
    return max(0.0, sum(values) / len(values)) if values else 0.0


async def pipeline_step(
    box: Mailbox,
    runner: StageRunner,
    where: Neighbours,
    micro: list[MicroBatch],
    rnd: Round,
    codec: Codec | PipeCodecs,
    timeout_s: float,
    timing: Timing,
    ledger: Ledger | None = None,
    run_ahead: int = 0,
) -> float:
    """Run the step's forwards and backwards; returns the weighted loss sum (last stage), else 0.0.
    ``run_ahead``: extra warm-up forwards (the plan's; see ``schedule.one_f_one_b``). ``codec``: one
    codec for both links, or each link's and direction's (``link_codecs``).

    Parameter gradients are left accumulated in the runner. Raises ``PipelineError`` when a neighbour
    fails to deliver within ``timeout_s`` or sends something undecodable. With a ``ledger`` every
    message is kept for the step seal (``peer/seal``), for the spot checks.
    """
    sends: list[asyncio.Task[None]] = []
    losses: list[tuple[torch.Tensor, float]] = []  # (last stage) each micro-batch's loss and share
    staging = runner.staging
    # A send fails (say, its tensor holds NaN and the codec refuses it) while the schedule waits on a
    # receive that now never comes: the failure ends that wait, so the error is this peer's own and not
    # a timeout blamed on its neighbour.
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    codecs = codec if isinstance(codec, PipeCodecs) else PipeCodecs.same(codec)

    def encode(tag: Tag, out: Outgoing, c: Codec) -> bytes:  # a worker thread: waits for the D2H copy
        try:
            return c.encode(out.wait(), key=(tag.round, tag.stream, tag.chunk))
        finally:
            out.release()

    async def send_one(peer: str, tag: Tag, out: Outgoing, c: Codec) -> None:
        try:
            t0 = time.perf_counter()
            payload = await asyncio.to_thread(encode, tag, out, c)
            timing.bytes_sent += len(payload)
            # raw: fp32 d_model-wide hidden states, what the cut carries without a bottleneck (whose
            # codes are r wide), so the ratio counts both the bottleneck and the codec
            tensor = out.tensor
            timing.wire_raw += tensor.numel() // max(tensor.shape[-1], 1) * runner.spec.d_model * 4
            timing.wire_coded += len(payload)
            if ledger is not None:
                ledger.note(peer, tag, payload)  # sealed with the step (peer/seal), before the READY
            timing.send += time.perf_counter() - t0
            await box.send(peer, tag, payload)
        except Exception as e:
            if not failed.done():
                failed.set_exception(e)
            raise

    def send(peer: str, tag: Tag, out: Outgoing, c: Codec) -> None:
        """Encode and send in the background: the next micro-batch's compute overlaps both (and, on a
        GPU, the device-to-host copy, which ``out`` started on the staging stream)."""
        sends.append(asyncio.create_task(send_one(peer, tag, out, c)))

    async def guarded(coro: Awaitable[T]) -> T:
        """``coro``'s result, unless a send fails first (then its error)."""
        task = asyncio.ensure_future(coro)
        watched: set[asyncio.Future[Any]] = {task, failed}
        try:
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
        if task not in done:
            failed.result()  # raises the send's error
        return task.result()

    async def recv(
        peer: str, tag: Tag, shape: tuple[int, int, int], codec: Codec
    ) -> tuple[torch.Tensor, float]:
        """The decoded tensor and when it would have been ready had this stage been waiting for it: its
        arrival plus the decode (perf_counter s)."""
        t0 = time.perf_counter()
        data, arrived = await guarded(box.recv_stamped(peer, tag, timeout_s))
        t1 = time.perf_counter()
        if ledger is not None:
            ledger.hold(peer, tag, data)  # its seal comes with the step's (peer/seal), before the READY
        try:
            if staging.pooled:  # straight into a pinned buffer that the compute thread copies to the GPU
                tensor = codec.decode_into(data, staging.host_buffer(shape), accumulate=False)
            else:
                tensor = codec.decode(data, expect=shape)
        except CompressionError as e:
            raise NeighbourError(peer, f"undecodable {tag} from {peer}: {e}") from None
        # One NaN or Inf would poison every later stage's output and every replica's mean after it.
        if not all_finite(tensor):
            raise NeighbourError(peer, f"{tag} from {peer} holds NaN or Inf")
        t2 = time.perf_counter()
        timing.recv += t2 - t0
        return tensor, arrived + (t2 - t1)

    async def compute(fn, *args):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        result = await asyncio.to_thread(fn, *args)
        timing.compute += time.perf_counter() - t0
        if failed.done():
            failed.result()
        return result

    def forward(m: int, x: torch.Tensor, mb: MicroBatch) -> torch.Tensor | Outgoing:
        out = runner.forward(m, x, mb.targets, mb.weight, None if runner.is_first else mb.inputs)
        return out if where.next is None else staging.to_host(out)  # the copy starts right here

    def backward(m: int, grad: torch.Tensor | None) -> Outgoing | None:
        grad_in = runner.backward(m, grad)
        return None if grad_in is None or where.prev is None else staging.to_host(grad_in)

    acts_sent: dict[int, float] = {}  # micro-batch -> when its activations went to the send
    acts_ready: dict[int, float] = {}  # micro-batch -> when its activations were here, decoded
    try:
        for kind, m in one_f_one_b(where.stage, where.n_stages, len(micro), run_ahead):
            mb = micro[m]
            if kind == "F":
                tag = make_tag(rnd, Stream.ACTIVATIONS, chunk=m)
                if where.prev is None:
                    assert mb.inputs is not None
                    x = mb.inputs
                else:
                    x, acts_ready[m] = await recv(
                        where.prev, tag, (*mb.rows, runner.model.width_in), codecs.acts_in
                    )
                out = await compute(forward, m, x, mb)
                if isinstance(out, Outgoing):
                    assert where.next is not None
                    acts_sent[m] = time.perf_counter()
                    send(where.next, tag, out, codecs.acts_out)
                else:
                    losses.append((out, mb.share))
            else:
                tag = make_tag(rnd, Stream.ACTIVATION_GRADS, chunk=m)
                shape = (*mb.rows, runner.model.width_out)
                grad = None
                if where.next is not None:
                    grad, ready = await recv(where.next, tag, shape, codecs.grads_in)
                    if m in acts_sent:
                        timing.round_trips.append(ready - acts_sent.pop(m))
                grad_in = await compute(backward, m, grad)
                if where.prev is not None:
                    assert grad_in is not None
                    if m in acts_ready:
                        timing.holds.append(time.perf_counter() - acts_ready.pop(m))
                    send(where.prev, tag, grad_in, codecs.grads_out)
        t0 = time.perf_counter()
        await asyncio.gather(*sends)
        timing.send += time.perf_counter() - t0
    except NeighbourError:
        raise
    except (WireError, CompressionError) as e:
        raise PipelineError(f"pipeline step (round {rnd}) of stage {where.stage} failed: {e}") from None
    finally:
        for task in sends:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: ``failed`` carried it up
            task.cancel()
        if failed.done():
            failed.exception()  # retrieved: its error went up through the task that raised it
        else:
            failed.cancel()
    loss = 0.0
    if losses:  # one device sync at the end, the same float sum in the same order as ever
        stacked = torch.stack([t.reshape(()) for t, _ in losses])
        values = await asyncio.to_thread(stacked.tolist) if staging.cuda else stacked.tolist()
        for value, (_, share) in zip(values, losses, strict=True):
            loss += value * share
    return loss
