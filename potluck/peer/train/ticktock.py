"""Tick-tock: two waves of a stage's work on one device, staggered so their memory peaks do not meet.

Each wave is a replica (its own weights, gradients and optimizer state) running its own micro-batch
schedule on its own thread, single-threaded. The tick wave starts each step at once; the tock wave
starts when the tick is ``d*`` seconds of profile time into its micro-batch (``model/memprofile.py``).
Three rules keep the accounted activation bytes of both waves within ``budget_bytes``:

1. Admission (``admit``): a second wave is refused (``ColocationRefused``) unless the staggered combined
   peak ``max_t M(t) + M(t - d)`` fits the budget; a simultaneous start (d = 0) is 2x one wave's.
2. Starts: a wave starts a micro-batch only when the other wave's phase p (profile seconds into its own
   micro-batch, from which op it runs and for how long) gives a predicted combined peak C(p) within
   the budget; the other wave idle always fits.
3. Layer gate: before each forward layer, a wave whose profiled saved bytes would take the measured
   total over the budget waits while the other wave is in its backward (which only frees memory).

What is "memory": the saved-activation bytes counted by ``model/savedbytes.py`` (on a CPU nothing else
can be capped; on a GPU it is the moving part of the allocator's use; weights, gradients and optimizer
state of both waves come off ``--max-memory`` first: ``activation_budget``). ``StepReport.violations``
counts the moments the measured total exceeded the budget: timing the profile did not foresee.

Inter-wave semantics (synchronous, like two separate peers): both waves run step s on identical weights,
each micro-batch's loss weighted by its share of the global batch; at the end of the step
``merge_gradients`` gives both waves the sum of their gradients (a SUM all-reduce over two replicas),
and each applies the same optimizer step. The waves meet once per step; the tock wave's lag ``d*`` is
the only idle time this costs (once per step, not per micro-batch).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from potluck.model.layerwise import Layerwise
from potluck.model.memprofile import MemoryProfile, Offset, best_offset, combined_peaks
from potluck.model.savedbytes import SavedBytes
from potluck.peer.errors import ColocationRefused

logger = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor | None, float]  # inputs, targets, weight
_POLL_S = 0.001  # how often a waiting wave re-reads the other's phase (phases move with time)


def activation_budget(max_memory_bytes: int, resident_bytes: int) -> int:
    """Bytes left for saved activations: ``--max-memory`` less both waves' weights, gradients and
    optimizer state (``resident_bytes``, all waves together)."""
    return max(0, max_memory_bytes - resident_bytes)


def admit(
    profile: MemoryProfile,
    budget_bytes: float,
    offset_s: float | None = None,
    resolution_s: float | None = None,
) -> Offset:
    """The stagger for a second wave: d* (or ``offset_s``), checked to fit; ``ColocationRefused`` when
    the combined peak at that offset exceeds ``budget_bytes``."""
    res = profile.period_s / 1000.0 if resolution_s is None else resolution_s
    m = profile.sample(res)
    best = best_offset(m, res, profile.period_s)
    if offset_s is not None:
        k = round(offset_s / res) % len(m)
        peak = float(np.max(m + np.roll(m, k)))
        best = Offset(k * res, k, res, profile.period_s, best.single_peak, peak, best.simultaneous_peak)
    if best.combined_peak > budget_bytes:
        raise ColocationRefused(
            f"two waves offset by {best.offset_s:.4f} s of a {profile.period_s:.4f} s micro-batch peak at "
            f"{best.combined_peak:.0f} bytes ({best.ratio:.2f}x one wave), over the budget of "
            f"{budget_bytes:.0f} bytes"
        )
    return best


@dataclass
class _Wave:
    model: Layerwise
    exclude: Sequence[torch.Tensor]
    op: int = -1  # index into the profile's ops of the op running; -1 between micro-batches
    op_started: float = 0.0
    mb_started: float = 0.0  # when its current micro-batch began: the earlier one leads
    started_any: bool = False  # has begun a micro-batch this step
    done: bool = True  # has no micro-batch left this step
    losses: list[float] = field(default_factory=list)
    cpu_s: float = 0.0


@dataclass(frozen=True)
class StepReport:
    seconds: float
    losses: tuple[tuple[float, ...], ...]  # per wave, per micro-batch (unweighted)
    peak_bytes: int  # largest measured total of accounted bytes, both waves
    violations: int  # changes that left the measured total over the budget
    start_waits: int  # polls a wave spent waiting to start a micro-batch
    gate_waits: int  # polls a wave spent waiting before a forward layer
    cpu_s: tuple[float, ...] = ()  # per wave, CPU seconds its thread ran: over ``seconds``, its core share


class TickTock:
    """Runs one or two waves step by step under an accounted activation budget (None: unbounded;
    then ``offset_s`` alone staggers the tock, and 0 lets both start together)."""

    def __init__(
        self,
        waves: Sequence[Layerwise],
        profile: MemoryProfile,
        budget_bytes: float | None,
        exclude: Sequence[Sequence[torch.Tensor]] = (),
        offset_s: float | None = None,
        resolution_s: float | None = None,
    ) -> None:
        if len(waves) not in (1, 2):
            raise ValueError(f"tick-tock runs one or two waves, not {len(waves)}")
        self.profile, self.budget = profile, budget_bytes
        self.res = profile.period_s / 1000.0 if resolution_s is None else resolution_s
        if budget_bytes is not None and len(waves) == 2:
            self.offset = admit(profile, budget_bytes, offset_s, self.res)
        else:
            m = profile.sample(self.res)
            best = best_offset(m, self.res, profile.period_s)
            self.offset = (
                best if offset_s is None else Offset(offset_s, 0, self.res, profile.period_s, 0, 0, 0)
            )
        self.combined = combined_peaks(profile.sample(self.res))
        self.starts = profile.op_starts()
        excl = list(exclude) or [() for _ in waves]
        self.waves = [_Wave(w, e) for w, e in zip(waves, excl, strict=True)]
        self._cond = threading.Condition()
        self._total = self._peak = self._violations = 0
        self._start_waits = self._gate_waits = 0

    # ---- accounting (called from SavedBytes, any wave's thread) ---------------------------------------

    def _changed(self, delta: int) -> None:
        with self._cond:
            self._total += delta
            self._peak = max(self._peak, self._total)
            if delta > 0 and self.budget is not None and self._total > self.budget:
                self._violations += 1
            if delta < 0:
                self._cond.notify_all()

    # ---- the three rules (under self._cond) -----------------------------------------------------------

    def _phase(self, w: _Wave, now: float) -> float:
        """Profile seconds into ``w``'s micro-batch: its op's start plus the time it has run, capped at
        the op's profiled length (a wave slower than its profile does not advance faster than its ops)."""
        k = w.op
        return self.starts[k] + min(now - w.op_started, self.starts[k + 1] - self.starts[k])

    def _may_start(self, me: int) -> bool:
        other = self.waves[1 - me] if len(self.waves) == 2 else None
        if other is None or other.done:
            return True
        if me == 1 and not self.waves[me].started_any:  # the tock's first start: the planned stagger
            if not other.started_any:
                return False
            if other.op >= 0 and self._phase(other, time.perf_counter()) < self.offset.offset_s:
                return False
        if other.op < 0 or self.budget is None:
            return True
        k = int(self._phase(other, time.perf_counter()) / self.res) % len(self.combined)
        return bool(self.combined[k] <= self.budget)

    def _gate_holds(self, me: int, layer: int) -> bool:
        """Hold forward ``layer`` of wave ``me`` back? Only ever while the other wave is sure to progress
        without it: in backward (which only frees), or ahead of it in forward (its remaining forward
        layers are reserved here, so the leader never waits for a follower and never overruns)."""
        if self.budget is None or len(self.waves) < 2:
            return False
        w, other = self.waves[me], self.waves[1 - me]
        need = self.profile.layers[layer].saved_bytes
        if other.op < 0:
            return False  # the other holds nothing: this wave alone fits (admission checked its peak)
        n_layers = len(self.profile.layers)
        if other.op >= n_layers:
            return self._total + need > self.budget
        if other.mb_started > w.mb_started:
            return False  # the other follows: it left room for this wave's forward
        remaining = sum(x.saved_bytes for x in self.profile.layers[other.op :])
        return self._total + need + remaining > self.budget

    # ---- one step -------------------------------------------------------------------------------------

    def _run_wave(self, me: int, batches: Sequence[Batch], errors: list[BaseException]) -> None:
        w = self.waves[me]
        counter = SavedBytes(w.exclude, listener=self._changed, trace=False)
        cpu0 = time.thread_time()
        try:
            for inputs, targets, weight in batches:
                with self._cond:
                    while not self._may_start(me):
                        self._start_waits += 1
                        self._cond.wait(_POLL_S)
                    w.started_any, w.op = True, 0
                    w.op_started = w.mb_started = time.perf_counter()
                with counter.hooks():
                    for k, op in enumerate(w.model.ops(inputs, targets, weight)):
                        with self._cond:
                            while op.kind == "forward" and self._gate_holds(me, op.layer):
                                self._gate_waits += 1
                                self._cond.wait(_POLL_S)
                            w.op, w.op_started = k, time.perf_counter()
                assert w.model.last_loss is not None
                w.losses.append(float(w.model.last_loss))
                with self._cond:
                    w.op = -1
                    self._cond.notify_all()
        except BaseException as e:  # re-raised in run_step's thread
            errors.append(e)
        finally:
            with self._cond:
                w.cpu_s = time.thread_time() - cpu0
                w.op, w.done = -1, True
                self._cond.notify_all()

    def run_step(self, batches: Sequence[Sequence[Batch]]) -> StepReport:
        """Run each wave's micro-batches (``batches[i]`` for wave i) and return when both are done; the
        gradients are left in each wave's parameters (``merge_gradients`` next, for synchronous steps)."""
        if len(batches) != len(self.waves):
            raise ValueError(f"{len(batches)} batch lists for {len(self.waves)} waves")
        with self._cond:
            self._peak = self._total
            self._violations = self._start_waits = self._gate_waits = 0
            for w, b in zip(self.waves, batches, strict=True):
                w.op, w.started_any, w.done, w.losses = -1, False, not b, []
        errors: list[BaseException] = []
        start = time.perf_counter()
        threads = [
            threading.Thread(target=self._run_wave, args=(i, b, errors), name=f"wave-{i}", daemon=True)
            for i, b in enumerate(batches)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        seconds = time.perf_counter() - start
        report = StepReport(
            seconds,
            tuple(tuple(w.losses) for w in self.waves),
            self._peak,
            self._violations,
            self._start_waits,
            self._gate_waits,
            tuple(w.cpu_s for w in self.waves),
        )
        logger.debug(
            "tick-tock step: %.4f s, peak %d bytes, %d violations",
            seconds,
            report.peak_bytes,
            report.violations,
        )
        return report


def merge_gradients(params: Sequence[Sequence[torch.Tensor]]) -> None:
    """The inter-wave rule: every wave's parameter ``p.grad`` becomes the sum over waves (wave order),
    as a SUM all-reduce over the same replicas on separate peers gives; dtype kept (float64 stays)."""
    for group in zip(*params, strict=True):
        grads = [p.grad for p in group]
        if all(g is None for g in grads):
            continue
        total = torch.zeros_like(group[0])
        for g in grads:
            if g is not None:
                total = total + g
        for p in group:
            p.grad = total.clone()
