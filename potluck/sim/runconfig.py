"""What a simulated run is told (``RunConfig``: policy, timings of detection, polls and restarts) and what
it reports (``RunResult``: tokens against the static optimum, every decision, samples over time)."""

from __future__ import annotations

from dataclasses import dataclass, field

from potluck.sim.churn import HOUR
from potluck.sim.coordinator import POLICIES
from potluck.sim.errors import SimError


@dataclass(frozen=True)
class RunConfig:
    policy: str = "repair"
    churn_aware: bool = False
    # Churn-blind, but its fresh decisions search the same per-tier pools as a churn-aware one (and
    # pick by rate): separates liveput's objective from the extra search it does.
    equal_search: bool = False
    hours: float = 24.0
    pool: int = 96  # peers the coordinator plans over (hierarchical planning)
    ttl_s: float = 30.0  # heartbeat record lifetime; refreshed every refresh_s
    refresh_s: float = 10.0
    # Crash detection as built (docs/training.md, "Noticing a death"). A killed or crashed process's
    # connections are reset by its kernel: the coordinator's daemon loses them and its dial is refused
    # within a poll (``probes.ConnectionWatch``, 0.5 s) and a dial. A machine that vanishes without
    # resetting them (power, sleep, a dropped network) is noticed when a wait on it runs out: the step
    # budget's floor (15 s) and the coordinator's 2 s probe, or its heartbeat's expiry if that comes
    # first. The share of silent crashes is an assumption (no volunteer trace tells them apart): 30%.
    fast_detect_share: float = 0.7
    fast_detect_s: float = 1.0
    silent_detect_s: float = 17.0
    poll_s: float = 1.0  # the coordinator's poll period: decisions start on its next tick
    restart_s: float = 2.0  # a new plan's start barrier and first step, beyond the hand-off
    periodic_s: float = HOUR
    scratch_every_s: float = 60.0  # "scratch" re-plans at most this often on joins
    sample_s: float = 300.0
    optimum_every_s: float = 900.0
    liveput_horizon_s: float = HOUR
    charge_decision_time: bool = True  # add the measured decision time to the stall (else poll_s)
    # Pipelines whose new peers still fetch state train without them meanwhile (potluck today: no; its
    # start barrier holds every peer until all hold their state).
    background_handoff: bool = False

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise SimError(f"unknown policy {self.policy!r}; known: {', '.join(POLICIES)}")

    def crash_detect_mean_s(self) -> float:
        """Expected seconds from a crash to its detection: fast ones, and silent ones at the first of
        the step budget and the heartbeat's expiry (``ttl_s`` after a refresh 0-``refresh_s`` ago)."""
        lo, hi = self.ttl_s - self.refresh_s, self.ttl_s
        a = self.silent_detect_s
        if a <= lo:
            silent = a
        elif a >= hi:
            silent = (lo + hi) / 2
        else:  # E[min(a, U(lo, hi))]: uniform below a, a above it
            silent = ((a - lo) * (a + lo) / 2 + (hi - a) * a) / (hi - lo)
        return self.fast_detect_share * self.fast_detect_s + (1 - self.fast_detect_share) * silent

    def crash_detect_s(self, u_fast: float, u_refresh: float) -> float:
        """One crash's detection delay from two uniform draws in [0, 1)."""
        if u_fast < self.fast_detect_share:
            return self.fast_detect_s
        return min(self.silent_detect_s, self.ttl_s - u_refresh * self.refresh_s)


@dataclass
class RunResult:
    policy: str
    churn_aware: bool
    hours: float
    tokens: float = 0.0
    optimum_tokens: float = 0.0
    decisions: list[dict[str, float]] = field(default_factory=list)
    samples: list[tuple[float, float, float]] = field(default_factory=list)  # (t h, rate, optimum rate)
    # (t h, tokens trained so far, the optimum's tokens so far), at each sample: the rates are snapshots
    # and miss the stalls between samples; these totals do not
    totals: list[tuple[float, float, float]] = field(default_factory=list)
    optimum_s: list[float] = field(default_factory=list)
    placed_departures: int = 0
    joins: int = 0
    leaves: int = 0

    @property
    def fraction(self) -> float:
        return self.tokens / self.optimum_tokens if self.optimum_tokens > 0 else 0.0
