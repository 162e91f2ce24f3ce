"""A trainer's DiLoCo local steps: the synced states its stage agrees on, and the outer sync in flight.

Between two outer syncs a stage's replicas hold different weights; what they agree on is the state of
the last sync (``synced_at``), kept in DiLoCo's snapshot, and the one before it (``synced_before``,
DiLoCo's ``previous``). That is what a peer serves, checkpoints and reports, never its drifting weights.

Streaming DiLoCo's overlap (``compression.outer_overlap``, the default): a sync that the run's next
step follows only starts when it is due (``start``). Its pseudo-gradient is taken then, its exchange
runs under the next inner steps, and the end of the ``compression.outer_delay``-th lands it (``land``,
the same step on every replica, always before the next sync): the snapshot moves to the outer step's
result, the same on every replica, and each replica's weights to that snapshot plus what its own inner
steps did meanwhile, which the next sync's pseudo-gradient then counts. Meanwhile the exchange's
messages are background traffic (``net/pace.py``): small, sent only once the pipeline's own bytes
have left the uplink, and at most at a share of it, so that the activations and the commits do not
queue behind them; landing waits for the rest at full speed. On the home testbed (4 local steps),
unpaced, a step's commit waited up to 1.3 s behind the sync's chunks; the mean step was 1.20 s with
the exchange under one step, 1.23-1.26 s under three, 1.10-1.14 s under three at a share of the
uplink, and 1.07 s in the pipeline's gaps (one run each, docs/benchmarks/wan.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass

import torch

from potluck.model.stage import StageRunner
from potluck.net.pace import Background
from potluck.net.tags import Phase, Round, RoundSpan
from potluck.peer.collectives.diloco import DiLoCo, Prepared
from potluck.peer.errors import CollectiveError
from potluck.peer.train.outer import synced_weights
from potluck.peer.train.pipeline import Timing

logger = logging.getLogger(__name__)

# Seconds a run whose step failed still waits for its sync in flight: the exchange of a 2-stage x
# 2-replica home-links job takes 0.4-1.7 s; a stage that lands it serves the newer state.
SETTLE_S = 3.0
# Elements per chunk of an overlapped sync's all-reduce, summed over its trees: with two replicas each
# message holds ~8 KB of int8 codes, 13 ms of a 5 Mbit/s uplink, as long as an activation or a commit
# message that comes right after it waits behind it.
BACKGROUND_CHUNK_ELEMENTS = 1 << 14


@dataclass
class InFlight:
    """An overlapped outer sync, due after ``step`` - 1 steps: its exchange (``task``) runs while the next
    inner step does; its outer step makes the stage's agreed state after ``step`` steps."""

    step: int
    mine: Prepared
    task: asyncio.Future[torch.Tensor]
    inner_steps: int = 0  # inner steps applied since the sync was due


class LocalSteps:
    """The DiLoCo side of one trainer, from the state it loaded (after ``step`` steps) on."""

    def __init__(self, diloco: DiLoCo, step: int, background: Background | None = None) -> None:
        """``background``: the mailbox's, whose gaps in the uplink an exchange in flight takes until
        someone waits for it."""
        self.diloco, self.background = diloco, background
        self.synced_at = step  # the last outer sync's step (or the loaded state's)
        self.synced_before: int | None = None  # the sync before it, once there is one
        self.in_flight: InFlight | None = None

    def synced(self, step: int) -> None:
        self.synced_before, self.synced_at = self.synced_at, step

    def start(
        self, step: int, mine: Prepared, exchange: Awaitable[torch.Tensor], span: RoundSpan | None = None
    ) -> None:
        """Run ``exchange`` (the stage's mean pseudo-gradient from ``mine``) under the next steps; its
        messages (the rounds of ``span``) go as background traffic meanwhile."""
        assert self.in_flight is None
        self.in_flight = InFlight(step, mine, asyncio.ensure_future(exchange))
        if self.background is not None:
            self.background.mark(span)

    def _waited(self) -> None:
        if self.background is not None:
            self.background.mark(None)  # whatever is left goes at full speed

    def stepped(self) -> None:
        """An inner step was applied: one more under the sync in flight, if any."""
        if self.in_flight is not None:
            self.in_flight.inner_steps += 1

    async def land(self, timing: Timing | None = None, timeout_s: float | None = None) -> None:
        """Wait for the sync in flight (``timeout_s``: at most that long, then it is dropped with a
        ``CollectiveError``) and apply its outer step; the wait counts as ``timing``'s all-reduce."""
        flight, self.in_flight = self.in_flight, None
        assert flight is not None
        self._waited()
        t0 = time.perf_counter()
        try:
            mean = await asyncio.wait_for(asyncio.shield(flight.task), timeout_s)
        except TimeoutError as e:
            raise CollectiveError(f"the outer sync of step {flight.step} did not end in {timeout_s} s") from e
        finally:
            if not flight.task.done():
                flight.task.cancel()
            if timing is not None:
                timing.allreduce += time.perf_counter() - t0
        # nothing ran under it (the run stopped, or its step failed before the update): the snapshot itself
        self.diloco.apply_outer(mean, flight.mine.pseudo if flight.inner_steps else None)
        self.synced(flight.step)

    async def settle(self, ended: bool, timeout_s: float) -> bool:
        """Land the sync in flight at the end of a run (a pause set under it, or a failed step); whether
        it landed. ``ended``: the run stopped where it meant to, so a failure to land is the run's; else
        a step failed, and the sync gets ``timeout_s`` at most (it has had most of a step already; one
        still waiting then most likely waits for the peer that died, and the worker's report of the
        failure must not wait for it)."""
        if ended:
            await self.land()
            return True
        try:
            await self.land(timeout_s=timeout_s)
        except Exception as e:  # the step's own failure is what the run reports
            logger.info("the outer sync of step %d was dropped: %s", self.synced_at, e)
            return False
        return True

    def drop(self) -> None:
        self._waited()
        if self.in_flight is not None:
            self.in_flight.task.cancel()
            self.in_flight = None

    def forgettable(self, done: RoundSpan) -> list[RoundSpan]:
        """``done`` (finished rounds the mailbox may forget) less the rounds the sync in flight still
        receives on: their late arrivals are what it waits for."""
        if self.in_flight is None:
            return [done]
        r = Round.unpack(done.stop)
        kept = Round(r.epoch, self.in_flight.step - 1, Phase.OUTER).attempts()
        return [RoundSpan(done.start, kept.start), RoundSpan(kept.stop, done.stop)]

    def state(self, runner: StageRunner, stepped: int, previous: bool) -> tuple[int, dict[str, torch.Tensor]]:
        """The state at the last outer sync (``previous``: the one before it), as (step, tensors): the
        sync's weights, this replica's inner AdamW moments as they are now (``stepped`` optimizer steps
        in), their step counts set back to the sync's. The weights always come from DiLoCo's snapshots:
        they change only inside an outer step, which runs on the event loop without a pause, so they are
        never torn, not even when an inner step or the sync itself failed half-way (churn run Z2: a kill
        during an outer sync left the stage's survivor serving nothing, and the swarm went back 500
        steps)."""
        step = self.synced_before if previous else self.synced_at
        assert step is not None
        tensors = {k: v.clone() for k, v in runner.state_tensors().items()}  # it may keep training
        tensors |= synced_weights(self.diloco, runner.model, previous)
        for k in [k for k in tensors if k.startswith("optim.") and k.endswith(".step")]:
            tensors[k] = (tensors[k] - (stepped - step)).clamp_min(0)
        return step, tensors
