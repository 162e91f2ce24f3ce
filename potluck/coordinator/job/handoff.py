"""The start step of a re-plan the swarm did not need to stop for (a graceful leave, placing a joiner).

After a crash the survivors stand still at the last committed step, so the next epoch starts there.
When nothing failed, the placed peers keep training while the new plan travels (coordinator poll, DHT,
each peer's plan poll) and the newest step they reported is already behind. Such a plan starts a few
steps *ahead*: the old plan's peers train on until exactly that step, stop there together and hold
the same state, which the new plan's peers take from their memory or pull over the swarm. Pure.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from potluck.protocol.training import Progress

MAX_AHEAD_STEPS = 1000  # a swarm of very short steps still switches within this many steps
DEFAULT_STEP_S = 1.0  # the step time assumed before any peer reported one (seconds)


def typical_step_s(records: Iterable[Progress], default: float = DEFAULT_STEP_S) -> float:
    """Median wall time of the newest step the peers reported (seconds; ``default`` with none)."""
    times = [r.timing.total for r in records if r.state == "training" and r.timing.total > 0]
    return statistics.median(times) if times else default


def handoff_step(
    reported: int, step_s: float, lead_s: float, last_step: int, sync_every: int = 1
) -> tuple[int, str]:
    """(the step a hand-off plan starts from, why). ``reported``: the newest step the swarm reported;
    ``step_s``: its step time (s); ``lead_s``: how long the new plan takes to reach every peer and the
    reports to reach the coordinator (s). The new plan keeps at least the job's last step
    (``last_step``) to run, so the job ends under it (its final checkpoint and "done" reports).
    ``sync_every``: the running plan's DiLoCo H; the start is rounded up to a sync, the only steps
    whose state its replicas agree on (at most ``last_step``: the old plan's runs sync at its end)."""
    ahead = min(MAX_AHEAD_STEPS, math.ceil(lead_s / max(step_s, 1e-3)) + 1)
    start = max(reported, min(last_step - 1, reported + ahead))
    if sync_every > 1:
        start = min(last_step, -(-start // sync_every) * sync_every)
    return start, (
        f"hand-off at step {start}: the swarm reported step {reported} and trains on for "
        f"{start - reported} step(s) of ~{step_s:.2f} s while the plan reaches every peer"
    )
