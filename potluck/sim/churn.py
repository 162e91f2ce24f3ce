"""Churn: volunteers' session lengths, off times, and a trace of who is live when.

Measurement studies of volunteer and peer-to-peer hosts find heavy-tailed availability: most sessions
are short, and a host that has stayed a while is likely to stay longer (a decreasing hazard), which
exponential (memoryless) models miss.
- Stutzbach and Rejaie, "Understanding Churn in Peer-to-Peer Networks", IMC 2006: session lengths of
  Gnutella, Kad and BitTorrent peers fit Weibull (shape 0.34-0.59) or log-normal, not exponential.
- Javadi, Kondo, Vincent and Anderson, "Discovering Statistical Models of Availability in Large
  Distributed Systems: An Empirical Study of SETI@home", IEEE TPDS 22(11), 2011: availability and
  unavailability intervals of ~230,000 SETI@home hosts fit Weibull, log-normal, gamma or
  hyper-exponential distributions; Weibull shapes below 1.
- Nurmi, Brevik and Wolski, "Modeling Machine Availability in Enterprise and Wide-area Distributed
  Computing Environments", Euro-Par 2005: Weibull and hyper-exponential fit machine availability best.
The parameters of the reference trace (``REFERENCE``) are ours: a Weibull shape of 0.5 (inside the
ranges above) and scales that put the median session near an hour. Times are seconds.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from potluck.sim.errors import SimError

logger = logging.getLogger(__name__)

HOUR = 3600.0


@dataclass(frozen=True)
class Sessions:
    """A session (or off-time) length distribution: "weibull" (shape, scale s) or "lognormal" (mu, sigma)."""

    kind: str
    a: float  # weibull: shape k; lognormal: mu of log(seconds)
    b: float  # weibull: scale (s); lognormal: sigma

    def __post_init__(self) -> None:
        if (
            self.kind not in ("weibull", "lognormal")
            or self.b <= 0
            or (self.kind == "weibull" and self.a <= 0)
        ):
            raise SimError(f"bad session distribution {self}")

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if self.kind == "weibull":
            return self.b * rng.weibull(self.a, size=size)
        return rng.lognormal(self.a, self.b, size=size)

    @property
    def mean(self) -> float:
        if self.kind == "weibull":
            return self.b * math.gamma(1.0 + 1.0 / self.a)
        return math.exp(self.a + self.b**2 / 2.0)

    @property
    def median(self) -> float:
        if self.kind == "weibull":
            return self.b * math.log(2.0) ** (1.0 / self.a)
        return math.exp(self.a)


@dataclass(frozen=True)
class ChurnModel:
    on: Sessions  # session lengths
    off: Sessions  # times away between sessions
    graceful_share: float = 0.5  # departures that hand over first (Ctrl-C); the rest crash (SIGKILL)

    @property
    def availability(self) -> float:
        return self.on.mean / (self.on.mean + self.off.mean)


# Median session ~1 h (Weibull 0.5: mean 2.08 x scale), median time away ~2.5 h.
REFERENCE = ChurnModel(Sessions("weibull", 0.5, 2.08 * HOUR), Sessions("weibull", 0.6, 4.0 * HOUR))


@dataclass(frozen=True)
class Trace:
    """Sessions of `identities` hosts: session k is (ident[k], start[k], end[k]) in seconds; `graceful[k]`
    says whether it ends with a hand-over. Sessions that began before 0 (the warm-up) have start < 0."""

    identities: int
    ident: np.ndarray
    start: np.ndarray
    end: np.ndarray
    graceful: np.ndarray

    def live_at(self, t: float) -> np.ndarray:
        return np.unique(self.ident[(self.start <= t) & (self.end > t)])


def make_trace(
    live_target: int, hours: float, model: ChurnModel, rng: np.random.Generator, warmup_h: float = 24.0
) -> Trace:
    """Alternating on/off renewal processes, one per identity, sized so ~`live_target` are live at once.

    Each identity starts at a random point of a warm-up of `warmup_h` hours so that the live set at time
    0 is close to stationary (long sessions over-represented, as they are in a real swarm).
    """
    if live_target < 1 or hours <= 0:
        raise SimError(f"a trace needs >= 1 live peer and > 0 hours; got {live_target}, {hours}")
    n = max(2, round(live_target / model.availability))
    horizon = hours * HOUR
    idents, starts, ends = [], [], []
    # Each identity's first session starts at a random phase of one on/off cycle before the warm-up.
    t = -warmup_h * HOUR - rng.uniform(0.0, model.on.mean + model.off.mean, size=n)
    while True:
        active = t < horizon
        if not active.any():
            break
        k = np.flatnonzero(active)
        on_len = model.on.draw(rng, len(k))
        off_len = model.off.draw(rng, len(k))
        s, e = t[k], t[k] + on_len
        keep = e > -warmup_h * HOUR
        idents.append(k[keep])
        starts.append(s[keep])
        ends.append(e[keep])
        t[k] = e + off_len
    if not idents or not sum(len(x) for x in idents):
        raise SimError("the trace has no session inside its window")
    ident = np.concatenate(idents)
    start, end = np.concatenate(starts), np.concatenate(ends)
    order = np.argsort(start, kind="stable")
    graceful = rng.random(len(order)) < model.graceful_share
    logger.info("trace: %d identities, %d sessions over %.1f h", n, len(order), hours)
    return Trace(n, ident[order], start[order], end[order], graceful)
