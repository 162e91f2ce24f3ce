"""Search and bounds on instances small enough to enumerate every placement."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from potluck.coordinator.placement import exhaustive
from potluck.coordinator.placement.bounds import dtfm_combinatorial, dtfm_lower_bound, dtfm_milp
from potluck.coordinator.placement.costmodel import DtfmJob, dtfm_cost
from potluck.coordinator.placement.objectives import DtfmObjective
from potluck.coordinator.placement.search import crossover, evaluate, local_search, pipelines
from potluck.coordinator.placement.templates import template_partitions
from tests.helpers.planning import clustered_net


def _brute_force(obj: DtfmObjective, n: int, r: int) -> float:
    empty = np.array([], dtype=np.int64)
    return min(
        evaluate(obj, np.array(p), empty).cost for p in exhaustive.balanced_partitions(list(range(n)), r)
    )


@pytest.mark.parametrize(("n", "s", "r", "seed"), [(6, 3, 2, 0), (6, 2, 3, 4), (8, 2, 4, 1), (8, 4, 2, 2)])
def test_search_and_bound_bracket_the_optimum(n: int, s: int, r: int, seed: int) -> None:
    net, job = clustered_net(n, 2, seed), DtfmJob(s, r, 0.65, 0.47)
    obj = DtfmObjective(net, job)
    devices = np.arange(n)
    best = _brute_force(obj, n, r)
    rng = np.random.default_rng(0)
    cands = [
        evaluate(obj, g, np.array([], dtype=np.int64))
        for _, g in template_partitions(obj.link, devices, s, r)
    ]
    found = local_search(obj, min(cands, key=lambda c: c.cost), rng, time.monotonic() + 5)
    assert found.cost >= best - 1e-9
    assert dtfm_combinatorial(obj, devices) <= best + 1e-9
    bound, method = dtfm_lower_bound(obj, devices, time_limit_s=20)
    assert method == "exhaustive-optimal" and bound == pytest.approx(best, rel=1e-9)
    assert exhaustive.dtfm_optimum(obj, devices) == pytest.approx(best, rel=1e-9)
    milp_bound, proven = dtfm_milp(obj, devices, time_limit_s=20)
    assert milp_bound <= best + 1e-6
    if proven:
        assert milp_bound == pytest.approx(best, rel=1e-6)
    # The layout the search reports really has the cost it claims (DT-FM's own formula).
    assert dtfm_cost(pipelines(obj, found), net, job).total == pytest.approx(found.cost)


def test_crossover_keeps_a_balanced_partition() -> None:
    obj = DtfmObjective(clustered_net(24, 4, 5), DtfmJob(4, 6, 0.65, 0.47))
    rng = np.random.default_rng(1)
    empty = np.array([], dtype=np.int64)
    p1 = evaluate(obj, rng.permutation(24).reshape(4, 6), empty)
    p2 = evaluate(obj, rng.permutation(24).reshape(4, 6), empty)
    for _ in range(10):
        child = crossover(p1, p2, rng)
        assert child.shape == (4, 6)
        assert sorted(child.ravel().tolist()) == list(range(24))
    # Identical parents up to relabelling give back the same partition (labels are aligned first).
    same = evaluate(obj, p1.groups[::-1].copy(), empty)
    child = crossover(p1, same, rng)
    assert sorted(map(sorted, child.tolist())) == sorted(map(sorted, p1.groups.tolist()))


def test_dtfm_with_more_peers_than_slots_uses_spares_and_a_valid_bound() -> None:
    n, s, r = 10, 2, 4
    net, job = clustered_net(n, 3, 11), DtfmJob(s, r, 0.65, 0.47)
    obj = DtfmObjective(net, job)
    # Brute force over every choice of the 8 active devices.
    best = min(
        _brute_force_subset(obj, list(active), r) for active in itertools.combinations(range(n), s * r)
    )
    assert dtfm_combinatorial(obj, np.arange(n)) <= best + 1e-9
    from potluck.coordinator.placement import PlannerConfig, PlanningState, plan
    from potluck.coordinator.placement.costmodel import DeviceSpec

    state = PlanningState(tuple(range(n)), tuple(DeviceSpec(50.0, 24.0) for _ in range(n)), net)
    result, _ = plan(state, job, 0.0, None, PlannerConfig(time_limit_s=2.0, bound_time_limit_s=0.0))
    assert result is not None
    assert len(result.spares) == 2
    assert sorted([p for row in result.stages for p in row] + list(result.spares)) == list(range(n))
    assert result.cost >= best - 1e-9 and result.lower_bound <= best + 1e-9


def _brute_force_subset(obj: DtfmObjective, active: list[int], r: int) -> float:
    empty = np.array([], dtype=np.int64)
    return min(
        evaluate(obj, np.array(active)[np.array(p)], empty).cost
        for p in exhaustive.balanced_partitions(list(range(len(active))), r)
    )
