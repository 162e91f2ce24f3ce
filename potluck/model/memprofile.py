"""A stage's activation-memory profile over one micro-batch, and the tick-tock offset it implies.

Wavelet (Wang et al., MLSys 2021) co-locates two waves of the same work on one device: a training
micro-batch's memory rises through the forward pass (autograd saves activations) and falls through the
backward, so a second wave started ``d`` seconds later puts its peak in the first wave's valley.

What is counted: the bytes of the tensors autograd saves for backward
(``torch.autograd.graph.saved_tensors_hooks``), each storage once, parameters excluded (they are
resident whatever runs). That is the part of a step's memory that moves; weights, gradients and
optimizer state are a constant floor the planner adds separately (``placement/colocate.py``).

Units throughout: bytes and seconds. ``M(t)`` is a step function of the time since the micro-batch
started; sampled at a resolution ``r`` (seconds) each bin holds the largest value inside it, so a
peak shorter than a bin is never lost. Offsets are whole bins: ``d = k * r``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from potluck.model.layerwise import Layerwise, Op
from potluck.model.savedbytes import SavedBytes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerTime:
    """One layer of the measured micro-batch: forward and backward seconds, bytes its forward saved."""

    forward_s: float
    backward_s: float
    saved_bytes: int


@dataclass(frozen=True)
class MemoryProfile:
    """M(t) of one micro-batch: ``live_bytes[i]`` is held from ``times_s[i]`` to the next change (the
    first time is 0.0; after ``period_s`` the wave starts its next micro-batch from zero)."""

    times_s: tuple[float, ...]
    live_bytes: tuple[int, ...]
    period_s: float
    layers: tuple[LayerTime, ...]

    def __post_init__(self) -> None:
        if len(self.times_s) != len(self.live_bytes) or not self.times_s or self.period_s <= 0:
            raise ValueError("a memory profile needs matching, non-empty times and bytes and a period > 0")

    @property
    def peak_bytes(self) -> int:
        return max(self.live_bytes)

    @property
    def forward_s(self) -> float:
        return sum(layer.forward_s for layer in self.layers)

    @property
    def backward_s(self) -> float:
        return sum(layer.backward_s for layer in self.layers)

    def op_starts(self) -> list[float]:
        """Profile time (s) at which each op of ``Layerwise.ops`` starts: forwards 0..L-1, then
        backwards L-1..0. The executor turns a wave's progress into a phase with it."""
        durations = [x.forward_s for x in self.layers] + [x.backward_s for x in reversed(self.layers)]
        return [0.0, *np.cumsum(durations).tolist()]

    def sample(self, resolution_s: float) -> np.ndarray:
        """M on ``ceil(period / resolution)`` bins (float64 bytes): each bin's largest value."""
        return sample_step_function(self.times_s, self.live_bytes, self.period_s, resolution_s)


def sample_step_function(
    times_s: Sequence[float], values: Sequence[float], period_s: float, resolution_s: float
) -> np.ndarray:
    """A step function (``values[i]`` from ``times_s[i]`` on) on bins of ``resolution_s`` seconds over
    [0, period_s): each bin gets the largest value it sees (at its start or at a change inside it)."""
    if resolution_s <= 0:
        raise ValueError(f"resolution {resolution_s} s: must be positive")
    n = max(1, int(np.ceil(period_s / resolution_s - 1e-9)))
    t = np.asarray(times_s, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    starts = np.arange(n) * resolution_s
    at = np.searchsorted(t, starts, side="right") - 1
    out = np.where(at >= 0, v[np.clip(at, 0, None)], 0.0)
    inside = t < period_s
    np.maximum.at(out, np.minimum((t[inside] / resolution_s).astype(np.int64), n - 1), v[inside])
    return out


# ---- the offset: pure arithmetic on a sampled profile ----------------------------------------------------


def combined_peaks(m: np.ndarray) -> np.ndarray:
    """``c[k] = max_t m[t] + m[t - k]`` (indices mod n): the peak of two periodic waves, the second
    started k bins after the first. ``c[0] = 2 max m``; ``c[k] == c[n - k]``."""
    m = np.asarray(m, dtype=np.float64)
    return np.array([float(np.max(m + np.roll(m, k))) for k in range(len(m))])


@dataclass(frozen=True)
class Offset:
    """The chosen stagger: ``offset_s = bins * resolution_s``; peaks in bytes."""

    offset_s: float
    bins: int
    resolution_s: float
    period_s: float
    single_peak: float
    combined_peak: float  # at offset_s
    simultaneous_peak: float  # at offset 0

    @property
    def ratio(self) -> float:
        return self.combined_peak / self.single_peak if self.single_peak else 1.0

    @property
    def ratio_zero(self) -> float:
        return self.simultaneous_peak / self.single_peak if self.single_peak else 1.0


def best_offset(m: np.ndarray, resolution_s: float, period_s: float | None = None) -> Offset:
    """d* = argmin_d max_t M(t) + M(t - d) over whole bins of ``resolution_s`` seconds; among exact ties
    the offset nearest P/2 (the symmetric one: each wave is then d* behind the other). Pure."""
    m = np.asarray(m, dtype=np.float64)
    n = len(m)
    period = n * resolution_s if period_s is None else period_s
    c = combined_peaks(m)
    best = float(c.min())
    ties = np.flatnonzero(c <= best)
    k = int(ties[np.argmin(np.abs(ties - n / 2.0))])
    return Offset(k * resolution_s, k, resolution_s, period, float(m.max()), best, float(c[0]))


def offset_of(profile: MemoryProfile, resolution_s: float | None = None) -> Offset:
    """``best_offset`` of a measured profile; the default resolution is P / 1000."""
    res = profile.period_s / 1000.0 if resolution_s is None else resolution_s
    return best_offset(profile.sample(res), res, profile.period_s)


# ---- measuring: one wave alone, layer by layer -------------------------------------------------------


def measure_profile(
    model: Layerwise,
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor | None]],
    exclude: Sequence[torch.Tensor] = (),
    repeats: int = 3,
) -> MemoryProfile:
    """Run ``repeats`` micro-batches of ``model`` alone (after one warm-up, whose gradients are
    dropped like the others': the caller's parameters keep whatever ``.grad`` they had plus these) and
    return the profile of the median-length run: its saved-bytes trace and its per-op times."""
    runs: list[tuple[float, list[float], list[tuple[float, int]], list[int]]] = []
    for r in range(repeats + 1):
        inputs, targets = batch()
        counter = SavedBytes(exclude)
        op_times: list[float] = []
        after_forward: list[int] = []
        start = time.perf_counter()
        counter.start_clock(start)
        with counter.hooks():
            last = start
            for op in model.ops(inputs, targets, weight=1.0):
                now = time.perf_counter()
                if op != Op("forward", 0):
                    op_times.append(now - last)
                    if len(after_forward) < len(model.layers):
                        after_forward.append(counter.live)
                last = now
            end = time.perf_counter()
            op_times.append(end - last)
        if r > 0:  # the first run warms allocators and caches
            runs.append((end - start, op_times, counter.events, after_forward))
    runs.sort(key=lambda x: x[0])
    total, op_times, events, after_forward = runs[len(runs) // 2]
    n_layers = len(model.layers)
    saved = [b - a for a, b in zip([0, *after_forward[:-1]], after_forward, strict=True)]
    layers = tuple(LayerTime(op_times[i], op_times[2 * n_layers - 1 - i], saved[i]) for i in range(n_layers))
    times = [0.0] + [t for t, _ in events]
    values = [0] + [v for _, v in events]
    logger.info(
        "memory profile: %d layers, P %.4f s (forward %.4f, backward %.4f, median of %d), peak %d bytes",
        n_layers,
        total,
        sum(x.forward_s for x in layers),
        sum(x.backward_s for x in layers),
        len(runs),
        max(values),
    )
    return MemoryProfile(tuple(times), tuple(values), total, layers)
