"""On a shipped DT-FM scenario with slow cross-region links (case 4: 2 Gbit/s within a region, 1.0-1.3
across), the plan changes when a stronger activation codec is on: the planner prices every boundary at
its link's codec, so the predicted step drops, and the selective scheme compresses only the slow
directions (``scripts/bench_codec_plans.py`` prints the same comparison)."""

from dataclasses import replace

import pytest

from potluck.coordinator.job.codecs import canonical_chain, codec_ratios, select_link_codecs
from potluck.coordinator.placement import PlacementPlan, PlannerConfig, plan
from potluck.coordinator.placement.costmodel import directed_bandwidth
from potluck.coordinator.placement.objectives import fixed_breakdown
from potluck.coordinator.placement.scenario import Scenario, load_scenario
from potluck.protocol.jobspec import CompressionSpec

STRONG = "int4:block=32|zstd"
DEFAULT = CompressionSpec()
SETTINGS = {
    "default": DEFAULT,
    "strong": CompressionSpec(activations=STRONG),
    "selective": CompressionSpec(activations_slow=STRONG, slow_link_gbps=1.5),
}


@pytest.fixture(scope="module")
def case4() -> Scenario:
    return load_scenario("dtfm-case4")


@pytest.fixture(scope="module")
def plans(case4: Scenario) -> dict[str, PlacementPlan]:
    cfg = PlannerConfig(seed=0, time_limit_s=1.5, bound_time_limit_s=0.3)
    out = {}
    for name, comp in SETTINGS.items():
        found, _ = plan(case4.state, replace(case4.step_job, codecs=codec_ratios(comp)), 0.0, None, cfg)
        assert found is not None
        out[name] = found
    return out


def grid(sc: Scenario, placement: PlacementPlan) -> list[list[int]]:
    index = {p: i for i, p in enumerate(sc.state.peers)}
    return [[index[p] for p in row] for row in placement.stages]


def test_the_same_placement_is_predicted_faster_with_the_stronger_codec(case4, plans):
    placed = grid(case4, plans["default"])
    before = fixed_breakdown(
        case4.state.net, case4.state.devices, replace(case4.step_job, codecs=codec_ratios(DEFAULT)), placed
    )
    strong = replace(case4.step_job, codecs=codec_ratios(SETTINGS["strong"]))
    after = fixed_breakdown(case4.state.net, case4.state.devices, strong, placed)
    assert before.total == pytest.approx(plans["default"].cost, rel=1e-6)  # the planner's own number
    assert max(after.link) < max(before.link) and after.total < before.total


def test_planning_with_the_stronger_codec_predicts_a_shorter_step(plans):
    assert plans["strong"].cost < plans["default"].cost
    assert plans["selective"].cost < plans["default"].cost


def test_the_selective_scheme_compresses_exactly_the_slow_directions(case4, plans):
    comp = SETTINGS["selective"]
    placed = grid(case4, plans["selective"])
    links = select_link_codecs(placed, case4.state.net, comp)
    bw = directed_bandwidth(case4.state.net)
    strong, default = canonical_chain(STRONG), canonical_chain(DEFAULT.activations)
    for j in range(len(placed) - 1 if links is not None else 0):
        for i, (a, b) in enumerate(zip(placed[j], placed[j + 1], strict=True)):
            assert links.chain(j, i, False) == (strong if bw[a, b] < 1.5 else default)
            assert links.chain(j, i, True) == (strong if bw[b, a] < 1.5 else default)
    # the scenario's in-region pairs (2 Gbit/s) are fast, its cross-region ones (1.0-1.3) slow
    assert {bw[a, b] < 1.5 for a in range(16) for b in range(16, 32)} == {True}
