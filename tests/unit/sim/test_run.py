"""Simulated runs with the real planner: policies, hand-off accounting, and the loopback replay."""

from __future__ import annotations

import numpy as np
import pytest

from potluck.coordinator.placement import PlacementPlan, PlannerConfig
from potluck.coordinator.placement.repair import state_bytes_per_peer
from potluck.sim.churn import HOUR, ChurnModel, Sessions, make_trace
from potluck.sim.coordinator import Coordinator, tokens_per_s
from potluck.sim.errors import SimError
from potluck.sim.population import make_population
from potluck.sim.reference import JOB
from potluck.sim.replay import load_run, replay
from potluck.sim.report import summarize
from potluck.sim.run import RunConfig, simulate

FAST = PlannerConfig(
    time_limit_s=0.2, bound_time_limit_s=0.1, max_stages=4, max_replicas=8, repair_time_limit_s=0.02
)
CALM = ChurnModel(Sessions("weibull", 1.0, 1e9), Sessions("weibull", 1.0, 1.0))  # nobody leaves
STORMY = ChurnModel(Sessions("weibull", 0.5, 0.03 * HOUR), Sessions("weibull", 0.6, 0.06 * HOUR))


def _run(model: ChurnModel, **kw: object) -> tuple[dict, object]:
    trace = make_trace(60, 0.5, model, np.random.default_rng(0), warmup_h=2.0)
    pop = make_population(trace.identities, np.random.default_rng(1))
    cfg = RunConfig(
        hours=0.5, pool=24, sample_s=60.0, optimum_every_s=900.0, charge_decision_time=False, **kw
    )  # type: ignore[arg-type]
    res = simulate(pop, trace, JOB, cfg, FAST, np.random.default_rng(2), FAST)
    return summarize(res), res


def test_without_churn_repair_keeps_the_first_plan() -> None:
    s, _ = _run(CALM, policy="repair")
    assert s["decisions"] == 0 and s["placed_departures"] == 0
    assert s["fraction_of_static_optimum"] > 0.5


def test_under_churn_repair_decides_and_moves_state() -> None:
    s, res = _run(STORMY, policy="repair")
    assert s["placed_departures"] > 0
    assert s["decisions"] > 0
    assert s["moved_per_event"]["max"] >= 1 and s["state_gb_moved"] > 0
    assert 0.0 < s["fraction_of_static_optimum"] < 1.5
    assert all(rate >= 0.0 for _, rate, _ in res.samples)


def test_naive_never_replans_and_loses_pipelines() -> None:
    s, res = _run(STORMY, policy="naive")
    assert s["decisions"] == 0
    rates = [rate for _, rate, _ in res.samples]
    assert rates[-1] <= max(rates)


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(SimError):
        RunConfig(policy="magic")


def test_handoff_counts_movers_and_their_bytes() -> None:
    pop = make_population(50, np.random.default_rng(3))
    coord = Coordinator(pop, JOB, FAST, pool=20)
    old = PlacementPlan("step", ((1, 2), (3, 4)), (5,), 10.0, 1.0, "x")
    new = PlacementPlan("step", ((1, 5), (3, 4)), (), 10.0, 1.0, "x")
    moved, nbytes, seconds = coord.handoff(old, new, np.array([1, 3, 4, 5]))
    assert moved == 1
    assert nbytes == pytest.approx(state_bytes_per_peer(JOB, 2))
    src = float(pop.up_gbps[1])  # the live holder of stage 0
    assert seconds == pytest.approx(nbytes * 8 / (min(float(pop.down_gbps[5]), src) * 1e9))
    assert coord.handoff(old, old, np.array([1, 2, 3, 4]))[0] == 0
    assert tokens_per_s(JOB, new) == pytest.approx(4096 * 1024 / 10.0)


def test_replay_of_the_loopback_run_is_within_20_percent() -> None:
    out = replay(load_run())
    assert abs(out["error"]) <= 0.2
    assert out["decision_s_max"] < 1.0
    assert len(out["predicted_stall_s"]) == len(out["measured_recovery_s"]) == 9


def test_liveput_prefers_a_plan_of_peers_likely_to_stay() -> None:
    pop = make_population(50, np.random.default_rng(4))
    coord = Coordinator(pop, JOB, FAST, pool=20, stall_s=10.0, horizon_s=3600.0)
    live = np.arange(10)
    stay = np.array([0.5] * 4 + [0.99] * 6)
    fickle = PlacementPlan("step", ((0, 1), (2, 3)), (), 10.0, 1.0, "x")
    steady = PlacementPlan("step", ((4, 5), (6, 7)), (), 10.0, 1.0, "x")
    assert coord.liveput(steady, live, stay) > coord.liveput(fickle, live, stay)
    assert coord.liveput(steady, live, None) == pytest.approx(tokens_per_s(JOB, steady))
    no_handoff = Coordinator(pop, JOB, FAST, pool=20, stall_s=10.0, horizon_s=3600.0, count_handoff=False)
    assert no_handoff.liveput(fickle, live, stay) > coord.liveput(fickle, live, stay)


def test_crash_detection_follows_the_connection_watch_and_the_step_budget() -> None:
    cfg = RunConfig()  # ttl 30 s refreshed every 10 s: a silent crash's record expires 20-30 s after it
    assert cfg.crash_detect_s(0.1, 0.5) == cfg.fast_detect_s  # connections reset: a poll and a dial
    assert cfg.crash_detect_s(0.9, 0.5) == cfg.silent_detect_s  # the step budget before the heartbeat
    # the mean, against the draws it summarises
    u = np.random.default_rng(0).random((200_000, 2))
    draws = [cfg.crash_detect_s(a, b) for a, b in u]
    assert cfg.crash_detect_mean_s() == pytest.approx(float(np.mean(draws)), rel=0.01)
    for budget in (25.0, 40.0):  # a budget between the expiries, and one past the latest: the heartbeat
        c = RunConfig(silent_detect_s=budget, fast_detect_share=0.0)
        mean = float(np.mean([c.crash_detect_s(a, b) for a, b in u[:50_000]]))
        assert c.crash_detect_mean_s() == pytest.approx(mean, rel=0.01)
    assert RunConfig(silent_detect_s=40.0, fast_detect_share=0.0).crash_detect_mean_s() == pytest.approx(25.0)
