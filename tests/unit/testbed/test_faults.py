"""Fault injection (``testbed/faults.py``) and the plan peers read (``net/faults.py``)."""

import os

import pytest

from potluck.net.faults import ENV, MAX_BYTES, NO_FAULTS, read_faults
from potluck.protocol.errors import FaultError
from potluck.testbed.faults import as_env, combine, delay, drop_links, injected, kill_at

PEER = "12D3KooW" + "a" * 44


def test_no_variable_means_no_faults():
    assert read_faults({}) == NO_FAULTS
    assert (
        NO_FAULTS.delay_s(0) == 0.0 and NO_FAULTS.kill_at_step is None and NO_FAULTS.dropped() == frozenset()
    )


def test_a_plan_round_trips_through_the_environment_entry():
    env = as_env(delay(0.5), delay(1.5, replicas=[2]), kill_at(12), drop_links(PEER))
    plan = read_faults(env)
    assert plan.delay_s(0) == 0.5 and plan.delay_s(2) == 2.0  # every replica's delay, plus replica 2's
    assert plan.kill_at_step == 12 and plan.dropped() == {PEER}


def test_combined_plans_keep_the_first_kill_and_every_link():
    plan = combine(kill_at(30), kill_at(12), drop_links(PEER), drop_links(PEER))
    assert plan.kill_at_step == 12 and plan.drop == [PEER]


def test_injected_sets_the_variable_for_the_block_and_restores_it(monkeypatch):
    monkeypatch.setenv(ENV, '{"kill_at_step": 3}')
    with injected(delay(0.25, replicas=[1])) as plan:
        assert read_faults() == plan and read_faults().delay_s(1) == 0.25
    assert read_faults().kill_at_step == 3
    monkeypatch.delenv(ENV)
    with pytest.raises(RuntimeError), injected(kill_at(5)):
        raise RuntimeError("a failing test body")
    assert ENV not in os.environ


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("soon", "not a fault plan"),
        ('{"delays": [{"seconds": -1}]}', "not a fault plan"),
        ('{"delays": [{"seconds": 1e9}]}', "not a fault plan"),
        ('{"kill_at_step": 0}', "not a fault plan"),
        ('{"drop": ["not-a-peer-id"]}', "not a fault plan"),
        ('{"explode": true}', "not a fault plan"),
        ("x" * (MAX_BYTES + 1), "longer than"),
    ],
)
def test_a_bad_plan_is_refused_with_the_variable_named(raw, why):
    with pytest.raises(FaultError, match=f"{ENV}.*{why}|{ENV} is {why}"):
        read_faults({ENV: raw})
