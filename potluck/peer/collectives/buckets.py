"""Gradient all-reduce in buckets that start while the backward pass is still running.

The step's last backward (micro-batch M - 1 of the 1F1B schedule) finishes gradients from the last
layer to the first. Parameters are grouped into buckets in that order; the moment a bucket's last
gradient is accumulated (a post-accumulate hook, fired in the compute thread), its all-reduce is handed
to the event loop and runs over the network while the thread goes on with earlier layers. Only the
buckets still in flight when the backward ends cost step time (``Timing.allreduce`` counts exactly that).

Effect on the update: none. Each bucket is reduced by the same tree executor over the same replicas, so
every replica still ends with identical gradients; only float summation order differs from one
whole-buffer all-reduce. Error feedback is kept per bucket.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import math

import torch

from potluck.compression import ErrorFeedback, decode, get_codec
from potluck.model.stage import StageRunner
from potluck.model.staging import Outgoing
from potluck.net.mailbox import Mailbox
from potluck.net.tags import BUCKET_PHASES, Round
from potluck.peer.collectives.robust import Audit
from potluck.peer.collectives.tree import tree_allreduce
from potluck.peer.config import AllReduceConfig
from potluck.peer.seal import Ledger
from potluck.protocol.collective import AllReduceSchedule

MAX_BUCKETS = 12  # aim: buckets of at least 1/12 of the stage's gradients (fewer, larger messages)


def _bucketize(sizes: list[int], cap: int) -> list[list[int]]:
    """Parameter indices in backward order (last layers first), cut into buckets of about ``cap`` elements.

    Greedy cutting can leave a few more buckets than total / cap; the cap grows until every bucket has a
    tag phase of its own (``Round.bucket``), since two buckets under one tag would mix their sums.
    """
    while True:
        buckets: list[list[int]] = []
        for i in reversed(range(len(sizes))):
            if not buckets or sum(sizes[j] for j in buckets[-1]) + sizes[i] > cap:
                buckets.append([])
            buckets[-1].append(i)
        if len(buckets) <= BUCKET_PHASES:
            return buckets
        cap += max(1, cap // 8)


class BucketSync:
    def __init__(
        self,
        runner: StageRunner,
        box: Mailbox,
        schedule: AllReduceSchedule,
        cfg: AllReduceConfig,
        bucket_elements: int,
        error_feedback: bool,
        overlap: bool = True,
        audit: Audit | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        """``ledger``: seals one-hop trees' messages and keeps them, for audits of the shard owners."""
        self.runner, self.box, self.schedule, self.cfg, self.overlap = runner, box, schedule, cfg, overlap
        self.audit, self.ledger = audit, ledger
        sizes = [p.numel() for p in runner.params]
        self.buckets = _bucketize(sizes, max(bucket_elements, math.ceil(sum(sizes) / MAX_BUCKETS)))
        self.bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}
        self.feedback = [ErrorFeedback() if error_feedback else None for _ in self.buckets]
        self._codec = get_codec(cfg.codec)
        self._pending: list[int] = []
        self._futures: list[concurrent.futures.Future[torch.Tensor] | None] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._round = Round(0, 0)  # the armed step's round; bucket b all-reduces in _round.bucket(b)
        self._step_cfg = cfg  # cfg with the armed step's timeout
        self.launched_early = 0  # buckets started from the backward's hook in the last step (overlap)

    def arm(self, rnd: Round, n_micro: int, timeout_s: float | None = None) -> None:
        """Before step ``rnd``'s pipeline: watch for final gradients during micro-batch ``n_micro - 1``.
        ``timeout_s``: the step's bound on each wait, which caps the configured chunk timeout (a replica
        that died mid-step is then noticed as soon as a pipeline neighbour's would be)."""
        self._loop = asyncio.get_running_loop()
        self._round = rnd
        self._step_cfg = self.cfg
        if timeout_s is not None and timeout_s < self.cfg.timeout_s:
            self._step_cfg = dataclasses.replace(self.cfg, timeout_s=timeout_s)
        self._pending = [len(b) for b in self.buckets]
        self._futures = [None] * len(self.buckets)
        self.launched_early = 0
        if self.overlap:
            self.runner.final_micro = n_micro - 1
            self.runner.on_grad_ready = self._ready

    def _ready(self, index: int) -> None:  # compute thread
        b = self.bucket_of[index]
        self._pending[b] -= 1
        if self._pending[b] == 0:
            self.launched_early += 1
            self._launch(b)

    def _launch(self, b: int) -> None:
        flat = torch.cat([self._grad(i).reshape(-1).float() for i in self.buckets[b]])
        # a GPU stage's bucket starts for the host (pinned buffer, side stream) from the thread that
        # made it; on the CPU this is the tensor itself
        staged = self.runner.staging.to_host(flat)
        assert self._loop is not None
        self._futures[b] = asyncio.run_coroutine_threadsafe(self._reduce(b, staged), self._loop)

    def _grad(self, i: int) -> torch.Tensor:
        p = self.runner.params[i]
        return p.grad if p.grad is not None else torch.zeros_like(p)

    async def _reduce(self, b: int, staged: Outgoing) -> torch.Tensor:
        try:
            flat = await asyncio.to_thread(staged.wait) if staged.pending else staged.wait()
            round_no = self._round.bucket(b).pack()
            ef = self.feedback[b]
            if ef is not None:  # error feedback at the source: send what the codec keeps, carry the rest
                flat = decode(self._codec.encode(flat, key=(round_no, 0, 0), state=ef))
            cfg, audit, ledger = self._step_cfg, self.audit, self.ledger
            return await tree_allreduce(self.box, self.schedule, flat, round_no, cfg, audit, ledger)
        finally:
            staged.release()  # tree_allreduce works on its own copy

    async def finish(self) -> None:
        """After the pipeline: start buckets not started yet, wait for all, write the sums back."""
        self.runner.final_micro, self.runner.on_grad_ready = None, None
        for b, fut in enumerate(self._futures):
            if fut is None:
                self._launch(b)
        futures = [asyncio.wrap_future(f) for f in self._futures if f is not None]
        try:
            results = await asyncio.gather(*futures)
        finally:
            for f in futures:
                f.cancel()
        if self.runner.staging.cuda:  # host -> device copies: off the event loop
            await asyncio.to_thread(self._write_back, results)
        else:
            self._write_back(results)

    def _write_back(self, results: list[torch.Tensor]) -> None:
        for members, flat in zip(self.buckets, results, strict=True):
            offset = 0
            for i in members:
                p = self.runner.params[i]
                n = p.numel()
                p.grad = flat[offset : offset + n].view_as(p).to(p.device, p.dtype).clone()
                offset += n

    def disarm(self) -> None:
        """Drop in-flight buckets (an aborted step)."""
        self.runner.final_micro, self.runner.on_grad_ready = None, None
        for f in self._futures:
            if f is not None:
                f.cancel()
