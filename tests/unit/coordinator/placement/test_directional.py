"""The directional link model: each transfer is costed over the direction it flows.

Home links upload 5-20x slower than they download. The `dtfm` objective costs a boundary's activations
a -> b and their gradients b -> a separately and each peer's shard sends over its own uplink; on a
symmetric network that is DT-FM's formula unchanged. These tests check the exact matching, the
objective against brute force, that a symmetric view of an asymmetric swarm picks worse plans, and that
peers' declared access links reach the planner, bounded by what their probes showed.
"""

import itertools

import numpy as np
import pytest

from potluck.coordinator.job.claims import believed_access
from potluck.coordinator.placement import PlannerConfig, PlanningState, plan
from potluck.coordinator.placement.bounds import dtfm_milp
from potluck.coordinator.placement.costmodel import (
    BatchSpec,
    DeviceSpec,
    ModelShape,
    StepJob,
    directed_bandwidth,
    dtfm_cost,
)
from potluck.coordinator.placement.exhaustive import dtfm_optimum
from potluck.coordinator.placement.matching import split_bottleneck_matching
from potluck.coordinator.placement.netmodel import AccessCapacity, build_netmodel, from_matrices
from potluck.coordinator.placement.objectives import DtfmObjective, StepObjective
from potluck.coordinator.placement.scenario import load_scenario, scenario_from_dict
from potluck.protocol.records import AccessLink, LinkReport, LinkSample
from potluck.testbed.homes import home_swarm


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_split_matching_is_the_exact_minimum_of_both_maxima(n: int) -> None:
    rng = np.random.default_rng(n)
    for _ in range(20):
        fwd, bwd = rng.random((n, n)), rng.random((n, n))
        value, match = split_bottleneck_matching(fwd, bwd)
        brute = min(
            max(fwd[i, p[i]] for i in range(n)) + max(bwd[i, p[i]] for i in range(n))
            for p in itertools.permutations(range(n))
        )
        assert value == pytest.approx(brute)
        assert sorted(match) == list(range(n))
        rows = np.arange(n)
        assert fwd[rows, match].max() + bwd[rows, match].max() == pytest.approx(value)


def _symmetric_view(net):  # what the planner saw before: both directions averaged, caps folded in
    bw = directed_bandwidth(net)
    return from_matrices((net.latency_ms + net.latency_ms.T) / 2, (bw + bw.T) / 2)


def test_objective_and_exhaustive_optimum_match_brute_force_on_a_small_asymmetric_swarm() -> None:
    sc = scenario_from_dict(home_swarm(6, seed=3, regions=2, stages=3, replicas=2))
    net, job = sc.state.net, sc.dtfm_job
    assert job is not None
    brute = min(
        dtfm_cost(np.array(p).reshape(3, 2), net, job).total for p in itertools.permutations(range(6))
    )
    obj = DtfmObjective(net, job)
    assert obj.directional
    assert dtfm_optimum(obj, np.arange(6)) == pytest.approx(brute)
    bound, optimal = dtfm_milp(obj, np.arange(6), time_limit_s=20.0)
    assert bound <= brute + 1e-6
    if optimal:
        assert bound == pytest.approx(brute, rel=1e-6)
    result, _ = plan(sc.state, job, 0.0, cfg=PlannerConfig(time_limit_s=2.0))
    assert result is not None and result.cost == pytest.approx(brute)


@pytest.mark.parametrize("seed", [0, 3, 5])
def test_the_directional_plan_beats_the_symmetric_one_where_links_are_asymmetric(seed: int) -> None:
    sc = scenario_from_dict(home_swarm(8, seed, regions=2, stages=4, replicas=2))
    net, job = sc.state.net, sc.dtfm_job
    assert job is not None
    cfg = PlannerConfig(seed=0, time_limit_s=1.0)
    old, _ = plan(PlanningState(sc.state.peers, sc.state.devices, _symmetric_view(net)), job, 0.0, cfg=cfg)
    new, _ = plan(sc.state, job, 0.0, cfg=cfg)
    assert old is not None and new is not None
    index = {p: i for i, p in enumerate(sc.state.peers)}

    def actual(p) -> float:
        return dtfm_cost(np.array([[index[x] for x in row] for row in p.stages]), net, job).total

    # The symmetric view predicts far less than its plan costs, and its plan is not the best one.
    assert old.cost < 0.8 * actual(old)
    assert new.cost == pytest.approx(actual(new))  # the prediction is the direction-by-direction cost
    assert actual(new) < 0.95 * actual(old)
    assert new.bound_method == "exhaustive-optimal" and new.cost == pytest.approx(new.lower_bound)


def test_symmetric_scenarios_keep_dt_fm_costs() -> None:
    sc = load_scenario("dtfm-case4")
    net, job = sc.state.net, sc.dtfm_job
    assert job is not None
    obj = DtfmObjective(net, job)
    assert not obj.directional
    rng = np.random.default_rng(0)
    grid = rng.permutation(net.n)[: job.n_stages * job.n_replicas].reshape(job.n_stages, job.n_replicas)
    # DT-FM's formula as its README states it (scenarios/README.md), on the raw matrices.
    lat, bw, r = net.latency_ms / 1e3, net.bandwidth_gbps, job.n_replicas
    dp = max(
        max(sum(2 * (lat[d, e] + job.c_dp_gb * 8 / (bw[d, e] * r)) for e in row if e != d) for d in row)
        for row in grid
    )
    pp = sum(
        max(lat[a, b] + job.c_pp_gb * 8 / bw[a, b] for a, b in zip(grid[j], grid[j + 1], strict=True))
        for j in range(len(grid) - 1)
    )
    assert dtfm_cost(grid, net, job).total == pytest.approx(dp + 2 * pp, rel=1e-12)


def _step_job() -> StepJob:
    return StepJob(ModelShape(layers=4, d_model=256, heads=4, vocab=256, seq_len=128), BatchSpec(16, 2))


def test_step_sync_pays_each_members_own_uplink() -> None:
    # Peer 0 uploads at 0.01 Gbit/s, downloads at 1; peer 1 is symmetric at 1 Gbit/s.
    bw = np.array([[1.0, 0.01], [1.0, 1.0]])
    net = from_matrices(np.full((2, 2), 5.0) - 5 * np.eye(2), bw)
    obj = StepObjective(net, [DeviceSpec(1.0, 8.0)] * 2, _step_job(), 1, 2)
    per_byte = obj.group_stat(np.array([0, 1]))[3]
    # Each member's sync is the slower of its sends and its receipts, both of which cross 0 -> 1 once.
    assert per_byte[0] == pytest.approx(2 * 8 / (0.01 * 1e9))
    assert per_byte[1] == pytest.approx(2 * 8 / (0.01 * 1e9))
    # The pipeline link weight is the slower direction, with the sender's upload cap applied.
    capped = from_matrices(np.zeros((2, 2)), np.ones((2, 2)), upload_gbps=[0.01, 1.0])
    link = StepObjective(capped, [DeviceSpec(1.0, 8.0)] * 2, _step_job(), 2, 1).link
    assert link[0, 1] == link[1, 0] == pytest.approx(2 * 2 * 128 * 256 * 8 / (0.01 * 1e9))


def test_netmodel_estimates_an_unmeasured_reverse_direction_from_access_links() -> None:
    peers = ["a", "b", "c"]
    measured = [("a", "b", 20.0, 0.01), ("b", "c", 20.0, 0.2), ("c", "a", 20.0, 0.2)]
    caps = {"a": AccessCapacity(upload_gbps=0.01, download_gbps=0.2), "b": AccessCapacity(0.2, 0.2)}
    net = build_netmodel(peers, measured, caps)
    assert net.bandwidth_gbps[0, 1] == pytest.approx(0.01)  # measured
    assert net.bandwidth_gbps[1, 0] == pytest.approx(0.2)  # b's upload, a's download: not a's slow upload
    assert net.latency_ms[1, 0] == pytest.approx(10.0)  # RTT / 2, both ways


def _report(peer: str, links: dict[str, float], up: float | None, down: float | None) -> LinkReport:
    return LinkReport(
        peer_id=peer,
        links=[LinkSample(dst=d, rtt_ms=10.0, bandwidth_gbps=g) for d, g in links.items()],
        issued_at=1.0,
        access=AccessLink(upload_gbps=up, download_gbps=down),
    )


def test_declared_access_is_believed_only_up_to_what_probes_showed() -> None:
    honest, braggart, x = "honest" * 4, "braggart" * 3, "x" * 16  # peer ids are >= 16 characters
    reports = {
        honest: _report(honest, {x: 0.02}, up=0.02, down=0.3),
        braggart: _report(braggart, {x: 0.02}, up=10.0, down=None),
        x: _report(x, {honest: 0.1}, up=None, down=None),
    }
    got = believed_access(reports)
    assert got[honest].upload_gbps == pytest.approx(0.02)
    assert got[honest].download_gbps == pytest.approx(1.5 * 0.1)  # what x's probe of it saw arrive
    assert got[braggart] == AccessCapacity(upload_gbps=pytest.approx(1.5 * 0.02), download_gbps=None)
    assert x not in got  # nothing declared


@pytest.mark.parametrize("bad", [-1.0, 0.0, float("inf"), 1e9])
def test_access_link_rejects_nonsense(bad: float) -> None:
    with pytest.raises(ValueError):
        AccessLink(upload_gbps=bad)


def test_run_ahead_covers_a_long_round_trip_and_is_zero_on_fast_links() -> None:
    from potluck.coordinator.job.plan import run_ahead_for
    from potluck.coordinator.placement.costmodel import step_time

    job = StepJob(ModelShape(layers=4, d_model=256, heads=4, vocab=256, seq_len=128), BatchSpec(64, 2))
    speed, memory = np.array([0.175, 0.175]), np.array([8.0, 8.0])  # ~20 ms a micro-batch per stage
    sync = np.zeros((2, 2))
    fast = step_time(speed, memory, np.array([1e-4]), sync, sync, job, 2)
    assert run_ahead_for(fast, fast.micro_batches) == 0
    # 100 ms one way next to ~20 ms of compute per micro-batch: the plan runs ahead, and the model says
    # the step gets faster by hiding the round trip (only the transfer's bandwidth part stays in a slot).
    slow_links, latency = np.array([0.11]), np.array([0.1])
    slow = step_time(speed, memory, slow_links, sync, sync, job, 2)
    ahead = run_ahead_for(slow, slow.micro_batches)
    assert ahead >= 5
    hidden = step_time(speed, memory, slow_links, sync, sync, job, 2, None, ahead, latency)
    assert hidden.total < 0.7 * slow.total
    # As far ahead as memory allows: a device with little room keeps fewer micro-batches in flight.
    assert run_ahead_for(slow, slow.micro_batches, job, [8.0, 8.0]) == ahead
    assert 0 <= run_ahead_for(slow, slow.micro_batches, job, [0.001, 8.0]) < ahead
    # the last stage runs nothing ahead (peer/train/schedule.py), so its memory does not limit it
    assert run_ahead_for(slow, slow.micro_batches, job, [8.0, 0.001]) == ahead
