"""A job's throughput, one formula for every reader: the launch and demo summaries, the dashboard, the
coordinator's status message and ``/metrics``.

tokens/s = (newest step - first step observed) x tokens per step / seconds between the two observations,
so the figure is what the swarm delivered, waits, re-plans and pauses included, not what one peer's last
step took. The ETA is the steps left at that rate. The coordinator observes the swarm's step each time it
reads progress (``JobRate.observe``); everyone else reads its ``Throughput``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Throughput:
    step: int  # the newest step observed (0 before any)
    tokens_per_s: float  # 0.0 until two different steps were observed
    steps_per_s: float
    eta_s: float | None  # seconds to the job's last step at this rate; None while the rate is unknown


@dataclass
class JobRate:
    tokens_per_step: int
    steps: int  # the job's last step
    first: tuple[int, float] | None = None  # (step, seconds on a monotonic clock) first observed
    last: tuple[int, float] | None = None  # the newest step observed, and when

    def observe(self, step: int, now: float) -> bool:
        """Note that the swarm reached ``step`` at ``now``; True when the step is new."""
        if self.first is None:
            self.first = (step, now)
        if self.last is None or step > self.last[0]:
            self.last = (step, now)
            return True
        return False

    @property
    def steps_per_s(self) -> float:
        if self.first is None or self.last is None or self.last[1] <= self.first[1]:
            return 0.0
        return (self.last[0] - self.first[0]) / (self.last[1] - self.first[1])

    @property
    def tokens_per_s(self) -> float:
        return self.steps_per_s * self.tokens_per_step

    def view(self) -> Throughput:
        rate = self.steps_per_s
        left = self.steps - (self.last[0] if self.last is not None else 0)
        eta = max(0.0, left / rate) if rate > 0 else None
        return Throughput(self.last[0] if self.last else 0, rate * self.tokens_per_step, rate, eta)
