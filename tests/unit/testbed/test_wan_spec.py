"""Scenario files -> the emulator's per-direction targets."""

import json
from pathlib import Path

import pytest

from potluck.testbed.errors import TestbedError
from potluck.testbed.wan.spec import BUNDLED, INF, link_targets, load_spec, spec_from_dict

ASYM = Path(__file__).parents[2] / "integration" / "wan" / "data" / "wan-3-asym.json"


def scenario():
    return {
        "name": "t",
        "devices": [{"id": 0, "upload_gbps": 0.01, "download_gbps": 0.1}, {"id": 1}],
        "links": {"latency_ms": [[0, 10], [30, 0]], "bandwidth_gbps": [[0, 0.05], [0.002, 0]]},
    }


def test_targets_take_the_narrowest_of_upload_path_and_download():
    spec = spec_from_dict(scenario())
    assert spec.up_mbps == (10.0, INF) and spec.down_mbps == (100.0, INF)
    t = {(x.a, x.b): x for x in link_targets(spec)}
    assert set(t) == {(0, 1), (1, 0)}
    assert t[(0, 1)].mbps == pytest.approx(10.0)  # upload 10 < path 50
    assert t[(1, 0)].mbps == pytest.approx(2.0)  # path 2 < download 100
    assert t[(0, 1)].rtt_ms == t[(1, 0)].rtt_ms == pytest.approx(40.0)


def test_scales_apply_to_rates_and_latencies():
    spec = spec_from_dict(scenario(), bandwidth_scale=0.5, latency_scale=2.0)
    assert spec.target_mbps(0, 1) == pytest.approx(5.0)
    assert spec.latency_ms[1][0] == pytest.approx(60.0)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda s: s["links"].update(latency_ms=[[0, 1]]), "2 x 2"),
        (lambda s: s["links"]["bandwidth_gbps"][0].__setitem__(1, 0), "out of range"),
        (lambda s: s["devices"][0].update(upload_gbps=-1), "rates must be > 0"),
        (lambda s: s.pop("links"), "links"),
        (lambda s: s.update(devices=[{"id": 0}]), "2..250"),
    ],
)
def test_malformed_scenarios_say_what_is_wrong(mutate, message):
    raw = scenario()
    mutate(raw)
    with pytest.raises(TestbedError, match=message):
        spec_from_dict(raw)


def test_test_scenario_is_asymmetric_as_the_integration_test_needs():
    spec = load_spec(str(ASYM))
    t = {(x.a, x.b): x for x in link_targets(spec)}
    assert len(t) == 6
    assert all(5.0 <= x.mbps <= 40.0 for x in t.values())
    assert any(spec.latency_ms[a][b] != spec.latency_ms[b][a] for a, b in t)
    assert any(t[(a, b)].mbps != t[(b, a)].mbps for a, b in t)


def test_bundled_home_5_is_a_home_like_asymmetric_swarm():
    spec = load_spec("home-5")
    assert spec.n == 5
    targets = link_targets(spec)
    assert all(20.0 <= t.rtt_ms <= 100.0 for t in targets)
    assert all(5.0 <= spec.down_mbps[i] / spec.up_mbps[i] <= 20.0 for i in range(spec.n))
    assert min(t.mbps for t in targets) >= 1.0 and max(t.mbps for t in targets) <= 50.0
    assert json.loads((BUNDLED / "home-5.json").read_text())["name"] == "home-5"


def test_unknown_scenario_names_the_bundled_ones():
    with pytest.raises(TestbedError, match="home-5"):
        load_spec("no-such-scenario")
