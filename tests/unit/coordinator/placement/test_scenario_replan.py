"""Scenario files (bundled and ad hoc) and re-planning policies (retire, join, hysteresis)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from potluck.coordinator.errors import ScenarioError
from potluck.coordinator.placement import PlannerConfig, PlanningState, plan
from potluck.coordinator.placement.costmodel import DeviceSpec, DtfmJob
from potluck.coordinator.placement.netmodel import from_matrices
from potluck.coordinator.placement.scenario import load_scenario
from tests.helpers.planning import clustered_net

FAST = PlannerConfig(time_limit_s=0.5, bound_time_limit_s=0.0)


def _write(tmp_path: Path, n: int = 4, **job: object) -> Path:
    lat = np.full((n, n), 20.0)
    np.fill_diagonal(lat, 0.0)
    doc = {
        "name": "tiny",
        "devices": [
            {"id": f"d{i}", "gpu": "RTX-4090-24GB", "tflops": 80 + i, "upload_gbps": 1.0} for i in range(n)
        ],
        "links": {"latency_ms": lat.tolist(), "bandwidth_gbps": np.ones((n, n)).tolist()},
        "job": {"D_PP": 2, "D_DP": 2, "c_dp_GB": 0.1, "c_pp_GB": 0.05, **job},
    }
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(doc))
    return path


def test_scenario_file_with_optional_fields(tmp_path: Path) -> None:
    sc = load_scenario(
        str(
            _write(
                tmp_path,
                step={
                    "layers": 6,
                    "d_model": 256,
                    "heads": 4,
                    "vocab": 1000,
                    "seq_len": 128,
                    "sequences_per_step": 8,
                },
            )
        )
    )
    assert sc.state.peers == ("d0", "d1", "d2", "d3")
    assert sc.state.devices[2] == DeviceSpec(82.0, 24.0)  # memory read from the GPU name
    assert sc.state.net.upload_gbps[0] == 1.0 and np.isinf(sc.state.net.download_gbps[0])
    assert sc.dtfm_job == DtfmJob(2, 2, 0.1, 0.05)
    assert sc.step_job.model.layers == 6
    result, _ = plan(sc.state, sc.step_job, 0.0, None, FAST)
    assert result is not None and sum(result.layers) == 6


def test_bundled_scenarios_load() -> None:
    for case in range(1, 6):
        sc = load_scenario(f"dtfm-case{case}")
        assert len(sc.state.peers) == 64 and sc.dtfm_job is not None
        assert sc.dtfm_job.n_stages * sc.dtfm_job.n_replicas == 64


def test_malformed_scenario_names_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"devices": [{"id": 0}], "links": {"latency_ms": [[0]]}}))
    with pytest.raises(ScenarioError, match="bandwidth_gbps"):
        load_scenario(str(bad))


def _state(ids: list[int], n: int = 16) -> PlanningState:
    net = clustered_net(n, 4, 9).subset(ids)
    return PlanningState(tuple(ids), tuple(DeviceSpec(50.0, 24.0) for _ in ids), net)


def test_dtfm_repair_without_spares_retires_a_pipeline() -> None:
    job = DtfmJob(4, 4, 0.65, 0.47)
    first, _ = plan(_state(list(range(16))), job, 0.0, None, FAST)
    assert first is not None and not first.spares
    gone = first.stages[1][2]
    repaired, reason = plan(_state([i for i in range(16) if i != gone]), job, 1.0, first, FAST)
    assert repaired is not None, reason
    assert "retired 1 pipeline" in reason
    assert repaired.n_stages == 4 and repaired.n_replicas == 3
    assert len(repaired.spares) == 3  # the retired pipeline's survivors wait as spares
    placed = {p for row in repaired.stages for p in row}
    assert gone not in placed and len(placed) == 12


def test_joined_peer_waits_as_spare_and_fills_the_next_hole() -> None:
    job = DtfmJob(4, 4, 0.65, 0.47)
    first, _ = plan(_state(list(range(16)), n=17), job, 0.0, None, FAST)
    assert first is not None
    joined, reason = plan(_state(list(range(17)), n=17), job, 1.0, first, FAST)
    assert joined is not None and "1 joined" in reason
    assert 16 in joined.spares
    gone = joined.stages[0][0]
    after, reason = plan(_state([i for i in range(17) if i != gone], n=17), job, 2.0, joined, FAST)
    assert after is not None, reason
    assert after.n_replicas == 4 and 16 in {p for row in after.stages for p in row}


def test_unchanged_swarm_keeps_its_plan() -> None:
    job = DtfmJob(4, 4, 0.65, 0.47)
    state = _state(list(range(16)))
    first, _ = plan(state, job, 0.0, None, FAST)
    assert first is not None
    again, _ = plan(state, job, 1.0, first, FAST)
    assert again is not None
    assert again.detail["moved_peers"] == 0
    assert again.cost == pytest.approx(first.cost)
    stage_of = {p: j for j, row in enumerate(first.stages) for p in row}
    assert all(stage_of[p] == j for j, row in enumerate(again.stages) for p in row)


def test_uniform_links_make_any_layout_optimal() -> None:
    n = 8
    lat = np.full((n, n), 10.0)
    np.fill_diagonal(lat, 0.0)
    state = PlanningState(
        tuple(range(n)), tuple(DeviceSpec(50.0, 24.0) for _ in range(n)), from_matrices(lat, np.ones((n, n)))
    )
    result, _ = plan(state, DtfmJob(2, 4, 1.0, 0.5), 0.0, None, PlannerConfig(time_limit_s=1.0))
    assert result is not None
    dp = 3 * 2 * (0.010 + 8.0 / 4)
    assert result.cost == pytest.approx(dp + 2 * (0.010 + 4.0))
    assert result.gap == pytest.approx(0.0, abs=1e-9)


def test_repair_that_cannot_keep_a_pipeline_falls_back_to_a_fresh_plan(tmp_path: Path) -> None:
    """plan() owns the fallback: when repair gives up, the answer is a fresh plan, and the reason says both."""
    sc = load_scenario(str(_write(tmp_path, n=4)))
    assert sc.step_job is not None
    first, _ = plan(sc.state, sc.step_job, 0.0, None, PlannerConfig(time_limit_s=0.5, stages=2, replicas=2))
    assert first is not None and first.n_stages == 2 and first.n_replicas == 2 and not first.spares
    # Three of the four leave and there are no spares: repair cannot keep a whole pipeline.
    keep = [0]
    left = PlanningState(
        tuple(sc.state.peers[i] for i in keep),
        tuple(sc.state.devices[i] for i in keep),
        sc.state.net.subset(keep),
    )
    result, reason = plan(left, sc.step_job, 1.0, first, FAST)
    assert "plan afresh" in reason and "fresh plan" in reason
    assert result is not None and result.n_stages == 1 and result.n_replicas == 1
    assert result.stages == ((sc.state.peers[0],),) and result.detail["planned_at"] == 1.0
