"""Event queue, session distributions, traces and the liveput predictor."""

from __future__ import annotations

import numpy as np
import pytest

from potluck.sim.churn import HOUR, REFERENCE, ChurnModel, Sessions, make_trace
from potluck.sim.engine import EventQueue
from potluck.sim.errors import SimError
from potluck.sim.liveput import SessionHistory


def test_events_pop_in_time_order_and_ties_in_push_order() -> None:
    q = EventQueue()
    q.push(5.0, "b")
    q.push(1.0, "a")
    q.push(5.0, "c")
    assert [q.pop().kind for _ in range(3)] == ["a", "b", "c"]
    assert q.now == 5.0
    with pytest.raises(SimError):
        q.push(4.0, "late")


@pytest.mark.parametrize("dist", [Sessions("weibull", 0.5, 1000.0), Sessions("lognormal", 6.0, 1.0)])
def test_session_draws_match_their_mean_and_median(dist: Sessions) -> None:
    x = dist.draw(np.random.default_rng(0), 400_000)
    assert abs(float(np.median(x)) / dist.median - 1) < 0.02
    assert abs(float(x.mean()) / dist.mean - 1) < 0.05


def test_bad_distribution_is_refused() -> None:
    with pytest.raises(SimError):
        Sessions("pareto", 1.0, 1.0)


def test_trace_keeps_about_the_target_live_and_is_heavy_tailed() -> None:
    tr = make_trace(2000, 6, REFERENCE, np.random.default_rng(0))
    for t in (0.0, 3 * HOUR, 6 * HOUR - 1):
        assert 1800 <= len(tr.live_at(t)) <= 2200
    assert (np.diff(tr.start) >= 0).all()
    lengths = tr.end - tr.start
    # Weibull shape 0.5: the mean is far above the median (an exponential's is 1.44x).
    assert float(lengths.mean()) > 3.0 * float(np.median(lengths))
    assert 0.45 < float(tr.graceful.mean()) < 0.55


def test_survival_rises_with_age_and_with_long_past_sessions() -> None:
    h = SessionHistory()
    for _ in range(50):
        h.record(1, 600.0)  # a peer that always left after 10 minutes
    h.record(2, 20 * HOUR)
    ids = np.array([1, 2, 3, 3])
    s = h.survival(ids, np.array([60.0, 60.0, 60.0, 10 * HOUR]), HOUR)
    assert ((s > 0) & (s <= 1)).all()
    assert s[0] < s[2] < s[1]  # short history < no history < long history, at the same age
    assert s[3] > s[2]  # decreasing hazard: an older session is likelier to last


def test_availability_of_a_model() -> None:
    m = ChurnModel(Sessions("weibull", 1.0, 100.0), Sessions("weibull", 1.0, 300.0))
    assert m.availability == pytest.approx(0.25)
