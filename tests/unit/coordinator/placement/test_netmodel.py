"""Network model: measured pairs kept, unmeasured pairs estimated, held-out error reported."""

from __future__ import annotations

import numpy as np
import pytest

from potluck.coordinator.errors import NetModelError
from potluck.coordinator.placement.netmodel import (
    AccessCapacity,
    LinkMeasurement,
    build_netmodel,
    from_matrices,
    holdout_error,
)


def _swarm(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    pos = rng.normal(0.0, 30.0, (n, 2))
    access = rng.uniform(1.0, 5.0, n)
    lat = np.linalg.norm(pos[:, None] - pos[None], axis=2) + access[:, None] + access[None]
    up = rng.lognormal(0.0, 0.7, n)
    down = up * rng.uniform(1.0, 3.0, n)
    return lat, np.minimum(up[:, None], down[None]), up, down


def _measure(lat: np.ndarray, bw: np.ndarray, per_peer: int, seed: int) -> list[LinkMeasurement]:
    rng = np.random.default_rng(seed)
    n = len(lat)
    out = []
    for i in range(n):
        for j in rng.choice(n, per_peer, replace=False):
            if i != j:
                out.append(LinkMeasurement(f"p{i}", f"p{j}", 2 * lat[i, j], bw[i, j]))
    return out


def test_measured_pairs_are_kept_and_rest_estimated() -> None:
    lat, bw, _, _ = _swarm(60, 0)
    ms = _measure(lat, bw, 8, 1)
    peers = [f"p{i}" for i in range(60)]
    model = build_netmodel(peers, ms)
    for m in ms[:20]:
        i, j = int(str(m.src)[1:]), int(str(m.dst)[1:])
        assert model.latency_ms[i, j] == pytest.approx(lat[i, j])
        assert model.bandwidth_gbps[i, j] == pytest.approx(bw[i, j])
        assert model.measured[i, j]
    off = ~np.eye(60, dtype=bool)
    assert np.isfinite(model.latency_ms).all() and (model.bandwidth_gbps[off] > 0).all()
    assert model.measured.sum() < 60 * 59 / 2  # most pairs were estimated


def test_coordinates_estimate_latency_of_held_out_pairs() -> None:
    lat, bw, up, down = _swarm(80, 2)
    peers = [f"p{i}" for i in range(80)]
    ms = _measure(lat, bw, 10, 3)
    err = holdout_error(peers, ms, fraction=0.2, seed=0)
    assert err.held_out > 20
    assert err.latency_median < 0.10
    caps = {f"p{i}": AccessCapacity(up[i], down[i]) for i in range(80)}
    with_caps = holdout_error(peers, ms, caps, fraction=0.2, seed=0)
    # Access capacities explain these bandwidths exactly (min of sender up, receiver down).
    assert with_caps.bandwidth_median < 1e-9 < err.bandwidth_median


def test_bad_reports_are_rejected() -> None:
    with pytest.raises(NetModelError):
        build_netmodel(["a", "b"], [("a", "zz", 10.0, 1.0)])
    with pytest.raises(NetModelError):
        build_netmodel(["a", "b"], [("a", "b", 10.0, 0.0)])
    with pytest.raises(NetModelError):
        from_matrices([[0, 1], [1, 0]], [[1, 0], [1, 1]])
