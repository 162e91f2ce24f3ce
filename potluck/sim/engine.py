"""A discrete-event engine: a virtual clock and a heap of timed events.

Nothing here reads a wall clock: time is whatever the last popped event says (seconds from the start of
the simulation). Events at the same time pop in the order they were pushed (a sequence number breaks
ties), so a run is deterministic for a seed.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass, field
from typing import Any

from potluck.sim.errors import SimError

logger = logging.getLogger(__name__)


@dataclass(order=True)
class Event:
    t: float  # seconds, virtual
    seq: int
    kind: str = field(compare=False)
    data: Any = field(compare=False, default=None)


class EventQueue:
    """Timed events, earliest first; `now` advances as they are popped and never goes back."""

    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = 0
        self.now = 0.0
        self.popped = 0

    def push(self, t: float, kind: str, data: Any = None) -> None:
        if t < self.now - 1e-9:
            raise SimError(f"event {kind!r} at {t:.3f} s is before the clock ({self.now:.3f} s)")
        heapq.heappush(self._heap, Event(t, self._seq, kind, data))
        self._seq += 1

    def pop(self) -> Event:
        ev = heapq.heappop(self._heap)
        self.now = ev.t
        self.popped += 1
        return ev

    def peek_time(self) -> float:
        return self._heap[0].t if self._heap else float("inf")

    def __len__(self) -> int:
        return len(self._heap)
