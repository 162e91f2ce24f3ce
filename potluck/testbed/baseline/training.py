"""One hivemind baseline peer's training side: its shard of the job's data, potluck's optimizer and
learning-rate schedule as hivemind factories, a fingerprint of the weights, and the loop of
``opt.step()`` calls with one record per epoch. What is matched against potluck and why: this
package's docstring.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from potluck.model.data import TokenDataset
from potluck.model.optim import build_optimizer, clip_coefficient, learning_rate
from potluck.model.transformer import StageModel
from potluck.protocol.jobspec import JobSpec
from potluck.testbed.baseline.peer import HivemindEvents, wait_for_tracker
from potluck.testbed.baseline.wire import WireCounter

logger = logging.getLogger(__name__)

FINGERPRINT_DIMS = 4  # random projections of the parameters in the "start" and "done" records


class PeerShard:
    """Peer ``index`` of ``n``: the j-th sequence it trains on is sequence ``j * n + index`` of the job's
    stream (``TokenDataset.replica_batch``'s rule), in micro-batches of ``size`` sequences."""

    def __init__(self, dataset: TokenDataset, index: int, n: int, size: int) -> None:
        if not 0 <= index < n:
            raise ValueError(f"peer index {index} of {n}")
        self.dataset, self.index, self.n, self.size = dataset, index, n, size
        self.sequences = 0  # sequences handed out so far

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.sequences
        self.sequences += self.size
        batch = torch.stack(
            [self.dataset.sequence(j * self.n + self.index) for j in range(first, first + self.size)]
        )
        return batch[:, :-1], batch[:, 1:]


@dataclass
class EpochStats:
    loss_sum: float = 0.0  # token-weighted: sum of micro-batch mean losses x their tokens
    tokens: int = 0
    samples: int = 0
    calls: int = 0


@dataclass
class Recorder:
    out: IO[str]
    started: float = field(default_factory=time.time)

    def write(self, event: str, **fields: Any) -> None:
        now = time.time()
        record = {"event": event, "time": round(now, 3), "elapsed_s": round(now - self.started, 3), **fields}
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()


def fingerprint(params: list[torch.Tensor]) -> list[float]:
    """``FINGERPRINT_DIMS`` fixed random projections of the parameters: equal on two peers that hold the
    same weights, apart when they differ (cheaper to compare than the weights)."""
    out = []
    for d in range(FINGERPRINT_DIMS):
        total = 0.0
        for i, p in enumerate(params):
            g = torch.Generator().manual_seed(1_000_003 * d + i)
            total += float((p.detach().float() * torch.randn(p.shape, generator=g)).sum())
        out.append(total)
    return out


def param_groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    """Matrices, then 1-D parameters: ``build_optimizer``'s decay and no-decay groups, in its order, so
    hivemind's groups and the optimizer's pair up position by position (empty groups left out, as
    ``build_optimizer`` leaves them out)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [[p for p in params if p.ndim >= 2], [p for p in params if p.ndim < 2]]
    return [{"params": g} for g in groups if g]


def optimizer_factory(job: JobSpec) -> Callable[[Any], torch.optim.Optimizer]:
    """hivemind calls this with its (offloaded) copies of the parameters, in the order given."""
    spec = job.optimizer

    def clip(opt: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        norm = (
            float(torch.sqrt(sum((g.float().pow(2).sum() for g in grads), torch.zeros(())))) if grads else 0.0
        )
        coef = clip_coefficient(spec, norm)
        if coef != 1.0:
            with torch.no_grad():
                for g in grads:
                    g.mul_(coef)

    def make(groups: Any) -> torch.optim.Optimizer:
        flat = [p for g in groups for p in g["params"]]
        opt = build_optimizer(flat, spec)
        mine = [[id(p) for p in g["params"]] for g in opt.param_groups]
        if mine != [[id(p) for p in g["params"]] for g in groups]:
            raise RuntimeError(
                "build_optimizer grouped the parameters differently; hivemind pairs them by position"
            )
        for p in flat:  # AdamW's own lazy initial state, so hivemind does not run its virtual step
            opt.state[p] = {
                "step": torch.tensor(0.0, dtype=torch.float32),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }
        opt.register_step_pre_hook(clip)
        return opt

    return make


def scheduler_factory(job: JobSpec, epochs: int) -> Callable[[torch.optim.Optimizer], Any]:
    spec = job.optimizer
    return lambda opt: LambdaLR(opt, lambda e: learning_rate(spec, int(e), epochs) / spec.lr)


def train(
    args: argparse.Namespace,
    rec: Recorder,
    opt: Any,
    model: torch.nn.Module,
    shard: PeerShard,
    job: JobSpec,
    epochs: int,
    counter: WireCounter,
    events: HivemindEvents,
) -> None:
    """``opt.step()`` per micro-batch until the swarm has finished ``epochs`` epochs (or ``--seconds``)."""
    seq_len = job.model.seq_len
    stats = EpochStats()
    epoch = opt.local_epoch
    started = time.monotonic()
    while opt.local_epoch < epochs:
        if args.seconds is not None and time.monotonic() - started > args.seconds:
            logger.info("--seconds %.0f reached at epoch %d", args.seconds, opt.local_epoch)
            break
        inputs, targets = shard.next_batch()
        opt.zero_grad()
        loss = StageModel.loss(model(inputs), targets)
        loss.backward()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(f"loss is {value} at epoch {opt.local_epoch}")
        n_tokens = inputs.numel()
        stats.loss_sum += value * n_tokens
        stats.tokens += n_tokens
        stats.samples += inputs.shape[0]
        stats.calls += 1
        opt.step()
        if stats.calls == 1 and opt.local_epoch == 0 and epoch == 0:
            wait_for_tracker(opt, args.n_peers, args.join_timeout)
        if opt.local_epoch != epoch:
            progress = opt.tracker.global_progress
            rec.write(
                "epoch",
                epoch=opt.local_epoch,  # epochs finished by this peer's optimizer
                trained_epoch=epoch,  # the epoch the loss below was computed in
                loss=stats.loss_sum / max(1, stats.tokens),
                samples=stats.samples,
                calls=stats.calls,
                tokens_local=shard.sequences * seq_len,
                tokens_swarm_nominal=opt.local_epoch * job.batch.tokens_per_step,
                lr=opt.opt.param_groups[0]["lr"],
                num_peers=progress.num_peers,
                **events.take(),
                bytes=counter.totals(),
            )
            epoch, stats = opt.local_epoch, EpochStats()
