"""A job's throughput, the one formula every view reads (``telemetry.summary``)."""

import pytest

from potluck.telemetry.summary import JobRate


def test_no_rate_until_two_steps_were_seen_apart_in_time():
    rate = JobRate(tokens_per_step=128, steps=100)
    assert rate.view().tokens_per_s == 0.0 and rate.view().eta_s is None
    rate.observe(5, 10.0)
    assert rate.view().tokens_per_s == 0.0 and rate.view().step == 5
    assert not rate.observe(5, 11.0)  # the same step again is no progress


def test_tokens_per_second_counts_the_swarms_steps_over_the_time_between_them():
    rate = JobRate(tokens_per_step=128, steps=100)
    rate.observe(10, 100.0)
    assert rate.observe(30, 110.0)
    view = rate.view()
    assert view.step == 30
    assert view.steps_per_s == pytest.approx(2.0)
    assert view.tokens_per_s == pytest.approx(256.0)
    assert view.eta_s == pytest.approx(35.0)  # 70 steps left at 2 steps/s


def test_a_pause_counts_against_the_rate_the_job_delivered():
    rate = JobRate(tokens_per_step=100, steps=1000)
    rate.observe(0, 0.0)
    rate.observe(100, 10.0)  # 10 steps/s while training
    rate.observe(101, 110.0)  # then paused for about 100 s
    assert rate.view().steps_per_s == pytest.approx(101 / 110.0)


def test_the_eta_is_zero_at_the_last_step():
    rate = JobRate(tokens_per_step=1, steps=20)
    rate.observe(10, 0.0)
    rate.observe(20, 5.0)
    assert rate.view().eta_s == 0.0
