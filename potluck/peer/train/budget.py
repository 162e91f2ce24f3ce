"""How long one step may wait for a neighbour, a chunk or the commit: derived from measured steps. Pure.

A fixed timeout is wrong both ways: 120 s lets a dead neighbour stall a 0.1 s step for two minutes
before anyone reports it, and a few seconds would fail every step of a large model on a home link. So
the bound on each wait follows the steps this peer measured: ``factor`` x the slowest of its last
``WINDOW`` steps (a step's time covers its compute and every link it crossed), never below ``floor_s``
(a loaded machine or a retransmit must not look like a death), never above ``cap_s`` (the user's
``--step-timeout``). Until a run has measured ``MIN_SAMPLES`` steps the cap applies: the first steps
include start-up and state hand-off, which say nothing of the steady pace.
"""

from __future__ import annotations

from collections import deque

WINDOW = 16  # recent steps considered
MIN_SAMPLES = 4  # steps measured before the budget leaves the cap


class WaitBudget:
    """The per-wait timeout of the next step, from the totals of the last steps."""

    def __init__(self, cap_s: float, floor_s: float, factor: float) -> None:
        self.cap_s, self.floor_s, self.factor = cap_s, floor_s, factor
        self._steps: deque[float] = deque(maxlen=WINDOW)

    def observe(self, step_s: float) -> None:
        """A committed step took ``step_s`` seconds (start to commit, waits included)."""
        if step_s >= 0:
            self._steps.append(step_s)

    def timeout_s(self) -> float:
        """Seconds each wait of the next step may take."""
        if len(self._steps) < MIN_SAMPLES:
            return self.cap_s
        return min(self.cap_s, max(self.floor_s, self.factor * max(self._steps)))
