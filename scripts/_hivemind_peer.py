"""One hivemind peer's training side for the baseline of scripts/wan_hivemind.py: its p2p daemon and DHT
in a loop thread, the start barrier, potluck's optimizer and schedule as hivemind factories, the
epoch records, and a bounded shutdown. What is matched against potluck and why: wan_hivemind.py's
docstring.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from potluck.model.data import TokenDataset
    from potluck.protocol.jobspec import JobSpec
from _hivemind_wire import WireCounter

BARRIER_POLL_S = 0.5  # how often a peer looks for the others before training

logger = logging.getLogger(__name__)


DHT_CALL_TIMEOUT_S = 15.0  # one DHT store or get of the start barrier


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
        import torch

        first = self.sequences
        self.sequences += self.size
        batch = torch.stack(
            [self.dataset.sequence(j * self.n + self.index) for j in range(first, first + self.size)]
        )
        return batch[:, :-1], batch[:, 1:]


def children_die_with_this_process() -> None:
    """Every process forked from here on (hivemind's DHT and averager processes are ``fork`` children)
    gets PR_SET_PDEATHSIG = SIGKILL, so a SIGKILLed worker leaves none of them behind."""
    from potluck import lifeline

    pending: dict[str, Callable[[], None] | None] = {}

    def before() -> None:
        pending["fn"] = lifeline.preexec(signal.SIGKILL)  # records this process as the parent

    def in_child() -> None:
        fn = pending.pop("fn", None)
        if fn is not None:
            fn()

    def in_parent() -> None:
        pending.pop("fn", None)

    os.register_at_fork(before=before, after_in_child=in_child, after_in_parent=in_parent)


class LoopThread:
    """An asyncio loop in a thread that lives as long as the worker: it spawns p2pd, whose
    PR_SET_PDEATHSIG fires when the spawning thread ends."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="p2p-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5.0)


async def start_p2p(host: str, initial_peers: list[str], timeout_s: float) -> Any:
    """A p2p daemon listening on ``host`` (TCP, any port), retrying until a bootstrap peer answers."""
    from hivemind.p2p import P2P

    from potluck.net.node import p2pd_dies_with_this_process

    maddr = host if host.startswith("/") else f"/ip4/{host}/tcp/0"
    deadline = time.monotonic() + timeout_s
    delay = 0.5
    while True:
        try:
            with p2pd_dies_with_this_process():
                return await P2P.create(
                    initial_peers=initial_peers or None,
                    host_maddrs=[maddr],
                    nat_port_map=False,  # no UPnP probing of a home router that is not there
                    startup_timeout=max(5.0, deadline - time.monotonic()),
                )
        except Exception as e:
            if not initial_peers or time.monotonic() + delay > deadline:
                raise
            logger.info("bootstrap peers not reachable yet (%s); retrying in %.1f s", e, delay)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 4.0)


class HivemindEvents(logging.Handler):
    """Reads hivemind.Optimizer's status messages (logged at INFO when ``verbose=True``): the size of each
    gradient and parameter averaging group, rounds that fell back to local gradients, and resyncs (a
    peer that fell behind downloads the whole state from another). hivemind's docs tune
    ``matchmaking_time`` by exactly these: "increase if you see 'averaged gradients with N peers' where
    N is below 0.9x the real size on >= 25% of epochs"."""

    PATTERNS = (
        ("grad_group", re.compile(r"^Averaged gradients with (\d+) peers")),
        ("state_group", re.compile(r"^Averaged parameters with (\d+) peers")),
        ("local_fallback", re.compile(r"^Proceeding with local gradients")),
        ("resync", re.compile(r"^Peer is out of sync")),  # it then downloads the full state
    )

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.lock_ = threading.Lock()
        self.epoch: dict[str, Any] = {}
        self.totals = {"local_fallback": 0, "resync": 0}

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            msg = record.getMessage()
            for key, pattern in self.PATTERNS:
                m = pattern.match(msg)
                if m is None:
                    continue
                with self.lock_:
                    if m.groups():
                        self.epoch[key] = int(m.group(1))
                    else:
                        self.epoch[key] = self.epoch.get(key, 0) + 1
                        self.totals[key] += 1

    def take(self) -> dict[str, Any]:
        """What happened since the last call, plus the running totals."""
        with self.lock_:
            out = {"grad_group": None, "state_group": None, "local_fallback": 0, "resync": 0}
            out.update(self.epoch)
            self.epoch = {}
            out.update({f"{k}_total": v for k, v in self.totals.items()})
        return out


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
    import torch

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
    import torch

    from potluck.model.optim import build_optimizer, clip_coefficient

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
    from torch.optim.lr_scheduler import LambdaLR

    from potluck.model.optim import learning_rate

    spec = job.optimizer
    return lambda opt: LambdaLR(opt, lambda e: learning_rate(spec, int(e), epochs) / spec.lr)


def wait_for_swarm(dht: Any, key: str, index: int, n: int, timeout_s: float) -> int:
    """Announce this peer under ``key`` and wait until all ``n`` peers have: every peer starts from the
    same initial weights at epoch 0, none trains alone first. Returns the peers seen."""
    from hivemind.utils import get_dht_time

    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline:
        left = max(1.0, deadline - time.monotonic())
        stored = dht.store(
            key, subkey=index, value=True, expiration_time=get_dht_time() + 3600, return_future=True
        )
        with contextlib.suppress(TimeoutError):
            stored.result(timeout=min(left, DHT_CALL_TIMEOUT_S))
        try:
            found = dht.get(key, latest=True, return_future=True).result(
                timeout=min(left, DHT_CALL_TIMEOUT_S)
            )
        except TimeoutError:
            found = None
        seen = len(found.value) if found is not None and isinstance(found.value, dict) else 0
        if seen >= n:
            return seen
        time.sleep(BARRIER_POLL_S)
    raise TimeoutError(f"only {seen} of {n} peers announced themselves within {timeout_s:.0f} s")


def wait_for_tracker(opt: Any, n: int, timeout_s: float) -> None:
    """Wait until hivemind's progress tracker counts all ``n`` peers (a peer is counted once it has
    reported samples, i.e. after its first ``opt.step``). Without this the first peer to finish its
    first target batch believes it is alone, steps without averaging and leaves the others to download
    its state. The throughput estimate is paused meanwhile, so the wait does not count as slowness."""
    deadline = time.monotonic() + timeout_s
    with opt.tracker.performance_ema.pause():
        while opt.tracker.global_progress.num_peers < n:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"hivemind's tracker saw {opt.tracker.global_progress.num_peers} of {n} peers "
                    f"within {timeout_s:.0f} s"
                )
            time.sleep(0.05)


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
    from potluck.model.transformer import StageModel

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


def shutdown(opt: Any, dht: Any, p2p: Any, loop: LoopThread, timeout_s: float) -> None:
    """hivemind's own shutdowns, each bounded: a thread does them and the worker waits ``timeout_s``
    at most (the children die with the worker anyway)."""

    def work() -> None:
        for name, fn in (
            ("optimizer", None if opt is None else opt.shutdown),
            ("dht", None if dht is None else dht.shutdown),
        ):
            if fn is None:
                continue
            try:
                fn()
            except Exception:
                logger.exception("%s shutdown failed", name)
        if p2p is not None:
            with contextlib.suppress(Exception):
                loop.run(p2p.shutdown(), 10.0)

    t = threading.Thread(target=work, name="shutdown", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        logger.warning("hivemind did not shut down within %.0f s; exiting anyway", timeout_s)
    loop.stop()
