"""Policies: G1 (HiGHS against vertex enumeration), G2 (aware >= agnostic), and edge cases."""

from __future__ import annotations

import numpy as np
import pytest

from potluck.coordinator.allocation import agnostic, equal_share, evaluate, make_problem, solve
from potluck.sim.cluster import random_problem
from potluck.sim.lp_oracle import reference_objective

LP = ("max_min", "makespan", "max_throughput")
CLASSES = ["v100", "p100", "k80"]


def gavel_instance(capacity=(1, 2, 3)):
    """Gavel's own test instance (policies_tests.py): two jobs, v100:1 / p100:2 / k80:3."""
    return make_problem(
        ["0", "1"], CLASSES, capacity, [[2.0, 1.0, 0.5], [3.0, 2.0, 1.0]], remaining=[300, 500]
    )


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


@pytest.mark.parametrize("policy", LP)
def test_g1_gavel_instance_matches_vertex_enumeration(policy):
    p = gavel_instance()
    assert rel(solve(p, policy).objective, reference_objective(p, policy)) <= 1e-6


@pytest.mark.parametrize("policy", LP)
def test_g1_space_sharing_matches_vertex_enumeration(policy):
    # Gavel's packing instance: the pair (0, 1) co-located on every class, one worker each
    p = make_problem(
        ["0", "1"],
        CLASSES,
        [1, 1, 1],
        [[2.0, 1.0, 0.5], [3.0, 2.0, 1.0]],
        remaining=[300, 500],
        pairs=[(0, 1)],
        pair_rates=[[[2.0, 3.0], [1.0, 2.0], [0.5, 1.0]]],
        shareable=[True, True, True],
    )
    got = solve(p, policy)
    assert rel(got.objective, reference_objective(p, policy)) <= 1e-6
    # a pair that runs each job at its full rate dominates: everything runs shared
    assert got.x[2].sum() == pytest.approx(1.0, abs=1e-6) or policy == "makespan"


def test_g1_random_two_by_two_instances():
    rng = np.random.default_rng(7)
    for _ in range(20):
        p = make_problem(
            ["a", "b"],
            ["x", "y"],
            rng.integers(1, 4, 2),
            rng.uniform(0.0, 5.0, (2, 2)),
            remaining=rng.uniform(10, 1000, 2),
            weights=rng.choice([1.0, 2.0, 3.0], 2),
        )
        for policy in LP:
            assert rel(solve(p, policy).objective, reference_objective(p, policy)) <= 1e-6, (policy, p)


def test_g2_aware_never_loses_to_agnostic(gavel):
    rng = np.random.default_rng(18)
    gains = []
    for _ in range(30):
        p = random_problem(rng, gavel)
        for policy in LP:
            aware, blind = solve(p, policy), solve(p, policy, aware=False)
            assert aware.objective >= blind.objective * (1 - 1e-6), (policy, p)
            assert blind.objective == pytest.approx(evaluate(p, policy, blind.x))
        gains.append(solve(p, "max_min").objective / solve(p, "max_min", aware=False).objective - 1)
    assert np.mean(gains) > 0.05  # Gavel's data is heterogeneous: awareness pays on average


def test_allocations_respect_the_constraints():
    p = gavel_instance((2, 1, 3))
    for policy in (*LP, "fifo"):
        for aware in (True, False):
            x = solve(p, policy, aware=aware).x
            assert (x >= -1e-9).all() and (x.sum(axis=1) <= 1 + 1e-6).all()
            assert (x.sum(axis=0) <= np.array([2, 1, 3]) + 1e-6).all()


def test_no_workers_no_jobs_one_job():
    empty = make_problem(["a"], CLASSES, [0, 0, 0], [[1.0, 1.0, 1.0]])
    assert solve(empty, "max_min").x.sum() == 0
    none = make_problem([], CLASSES, [1, 1, 1], np.zeros((0, 3)))
    assert solve(none, "makespan").x.shape == (0, 3)
    one = make_problem(["a"], CLASSES, [1, 1, 1], [[3.0, 2.0, 1.0]])
    for policy in (*LP, "fifo"):
        x = solve(one, policy).x
        assert x[0, 0] == pytest.approx(1.0, abs=1e-6)  # alone, a job takes its fastest class


def test_zero_throughput_job_gets_nothing_and_does_not_block_others():
    p = make_problem(["a", "b"], CLASSES, [1, 1, 1], [[0.0, 0.0, 0.0], [3.0, 2.0, 1.0]])
    for policy in (*LP, "fifo"):
        res = solve(p, policy)
        assert res.x[0].sum() == 0 and res.throughput[1] > 0


def test_scale_beyond_a_class_excludes_it():
    p = make_problem(["a"], CLASSES, [2, 8, 8], [[10.0, 1.0, 1.0]], scale=[4])
    assert solve(p, "max_throughput").x[0, 0] == 0
    assert equal_share(p)[0, 0] == 0


def test_weights_buy_share():
    p = make_problem(["a", "b"], ["x"], [1], [[1.0], [1.0]], weights=[1.0, 3.0])
    assert solve(p, "max_min").throughput == pytest.approx([0.25, 0.75], abs=1e-6)


def test_agnostic_sees_one_rate_per_job_and_spreads():
    p = gavel_instance()
    blind = agnostic(p)
    assert np.allclose(blind.rates, blind.rates[:, :1])
    x = solve(p, "max_min", aware=False).x
    assert np.allclose(x[0] / x[0].sum(), np.array([1, 2, 3]) / 6)


def test_fifo_serves_in_arrival_order():
    p = make_problem(["late", "early"], ["x"], [1], [[1.0], [1.0]], order=[5.0, 1.0])
    assert solve(p, "fifo").x[:, 0].tolist() == [0.0, 1.0]


def test_water_filling_raises_the_non_bottleneck_jobs():
    # job c can only use class z; a and b share x; one max-min level leaves c at the bottleneck's share
    p = make_problem(["a", "b", "c"], ["x", "z"], [1, 4], [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    filled = solve(p, "max_min", water_fill=3)
    assert filled.throughput == pytest.approx([0.5, 0.5, 1.0], abs=1e-6)
