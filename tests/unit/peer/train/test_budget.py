"""The per-wait timeout follows the measured steps, between a floor and the user's cap."""

from potluck.peer.train.budget import MIN_SAMPLES, WINDOW, WaitBudget


def test_the_cap_holds_until_steps_are_measured():
    b = WaitBudget(cap_s=120.0, floor_s=15.0, factor=10.0)
    for _ in range(MIN_SAMPLES - 1):
        b.observe(0.1)
        assert b.timeout_s() == 120.0  # start-up steps say nothing of the pace
    b.observe(0.1)
    assert b.timeout_s() == 15.0  # 10 x 0.1 s is below the floor


def test_slow_steps_raise_it_up_to_the_cap_and_old_ones_age_out():
    b = WaitBudget(cap_s=120.0, floor_s=15.0, factor=10.0)
    for _ in range(MIN_SAMPLES):
        b.observe(3.0)
    assert b.timeout_s() == 30.0
    b.observe(20.0)
    assert b.timeout_s() == 120.0  # 200 s capped by --step-timeout
    for _ in range(WINDOW):
        b.observe(2.0)
    assert b.timeout_s() == 20.0  # the slow step is out of the window


def test_a_cap_below_the_floor_wins():
    b = WaitBudget(cap_s=5.0, floor_s=15.0, factor=10.0)
    for _ in range(MIN_SAMPLES):
        b.observe(0.05)
    assert b.timeout_s() == 5.0
