"""Two replicas' shares of a step on one device: tick-tock waves of a whole-model stage (issue 19).

A plan may give a peer that offers two slots ``waves = 2`` (``StageAssignment.waves``): it then trains
two data shards of each step, as two separate peers would, but on one device. Each shard is a *wave*
with its own copy of the weights and its own gradients (``StageRunner``s built from the same seed and
kept equal), run on its own thread by ``TickTock``: the second wave starts ``d*`` into the first's
micro-batch so their activation peaks do not meet, and a layer gate holds a wave's forward back when
the two would pass the memory budget (docs/ticktock.md).

Inter-wave rule (synchronous, like two separate peers): both waves run step s on identical weights,
each micro-batch's loss weighted by its share of the global batch. After the step the second wave's
gradients are added to the first's (the sum two peers' SUM all-reduce would add), the first wave's
gradients go to the stage's all-reduce once for both, the first wave's optimizer steps, and the second
copies the first's weights. Only the first keeps AdamW state: the second never steps on its own.

The memory profile is the peer's own: measured on this stage's first micro-batch once the state is
loaded, before the start barrier (one warm-up and three timed micro-batches of one wave). Admission
follows: with ``--max-memory`` the staggered combined peak must fit what is left after both waves'
weights, gradients and the optimizer state; if it does not, the waves run one after the other (the
same gradients, no co-location), and the peer says so in its log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from potluck.model.layerwise import Layerwise, stage_layers
from potluck.model.memprofile import measure_profile
from potluck.model.stage import StageRunner
from potluck.peer.errors import ColocationRefused
from potluck.peer.train.pipeline import MicroBatch
from potluck.peer.train.ticktock import Batch, TickTock, activation_budget

logger = logging.getLogger(__name__)

PROFILE_REPEATS = 3  # timed micro-batches of the profile (after one warm-up); the median is kept


class Waves:
    """The second wave of a two-wave peer, beside the trainer's own runner (the first wave)."""

    def __init__(self, first: StageRunner, max_memory_bytes: int | None) -> None:
        if not (first.is_first and first.is_last):
            raise ValueError("tick-tock waves run a whole-model stage (a one-stage plan)")
        self.first = first
        f = first
        self.second = StageRunner(
            f.spec, f.first, f.last, f.seed, f.optimizer_spec, f.device, f.precision, f.cuts
        )
        self.max_memory_bytes = max_memory_bytes
        self.layers = [self._layers(first), self._layers(self.second)]
        self.tick: TickTock | None = None  # None until prepared, or when admission refused the pair
        self.refused: str | None = None  # why the waves run one after the other
        self.follow()

    @staticmethod
    def _layers(runner: StageRunner) -> Layerwise:
        return stage_layers(runner.model, runner.device, runner.precision)

    def follow(self) -> None:
        """The second wave takes the first's weights (after a load, or the step's update)."""
        with torch.no_grad():
            for mine, theirs in zip(self.second.params, self.first.params, strict=True):
                mine.copy_(theirs)
                mine.grad = None

    def resident_bytes(self) -> int:
        """Both waves' weights and gradients and the first's two AdamW moments (bytes)."""
        weights = sum(p.numel() * p.element_size() for p in self.first.params)
        return 2 * weights + 2 * weights + 2 * weights

    def prepare(self, sample: MicroBatch) -> None:
        """Measure one wave's memory profile on ``sample`` and admit the pair (or run them in turn)."""
        self.follow()
        x, y = self._to_device(sample)
        profile = measure_profile(self.layers[1], lambda: (x, y), self.second.params, PROFILE_REPEATS)
        self.follow()  # the profile's gradients are dropped
        budget = None
        if self.max_memory_bytes is not None:
            budget = activation_budget(self.max_memory_bytes, self.resident_bytes())
        exclude = [self.first.params, self.second.params]
        try:
            self.tick = TickTock(self.layers, profile, budget, exclude)
        except ColocationRefused as e:
            self.tick, self.refused = None, str(e)
            logger.warning("tick-tock refused, the two waves run one after the other: %s", e)
            return
        off = self.tick.offset
        logger.info(
            "tick-tock: two waves offset by %.4f s of a %.4f s micro-batch, peak %.2fx one wave's, budget %s",
            off.offset_s,
            off.period_s,
            off.ratio,
            "none" if budget is None else f"{budget} bytes",
        )

    def _to_device(self, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        assert mb.inputs is not None and mb.targets is not None  # a whole-model stage has both
        staging = self.first.staging
        return staging.to_device(mb.inputs), staging.to_device(mb.targets)

    def run(self, micro: Sequence[Sequence[MicroBatch]]) -> tuple[float, float]:
        """Both waves' micro-batches of one step (``micro[w]`` for wave w); leaves the sum of their
        gradients in the first wave's parameters. Returns (the share-weighted loss sum, seconds)."""
        if len(micro) != 2:
            raise ValueError(f"two waves need two micro-batch lists, not {len(micro)}")
        start = time.perf_counter()
        for p in self.second.params:  # an aborted step's leftovers
            p.grad = None
        batches: list[list[Batch]] = [[(*self._to_device(mb), mb.weight) for mb in ms] for ms in micro]
        if self.tick is not None:
            losses = self.tick.run_step(batches).losses
        else:  # refused (or not prepared): in turn, the same gradients
            losses = tuple(tuple(w.run(*b) for b in bs) for w, bs in zip(self.layers, batches, strict=True))
        self._merge()
        loss = 0.0
        for ms, ls in zip(micro, losses, strict=True):
            for mb, value in zip(ms, ls, strict=True):
                loss += value * mb.share
        return loss, time.perf_counter() - start

    def _merge(self) -> None:
        """The inter-wave rule: the first wave's gradients become the sum of both (wave order)."""
        with torch.no_grad():
            for mine, theirs in zip(self.first.params, self.second.params, strict=True):
                if theirs.grad is None:
                    continue
                mine.grad = theirs.grad.clone() if mine.grad is None else mine.grad + theirs.grad
                theirs.grad = None
