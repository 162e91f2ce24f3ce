"""Synthetic home swarms: volunteers on asymmetric access links, spread over a few regions.

What makes a home swarm hard to plan is the access link, not the backbone: a peer uploads 5-20x slower
than it downloads, so every pair's two directions differ, and a few well-connected peers (a university,
a rented server) are worth far more than their GPU. The generator below draws such swarms from a seed,
as scenario dictionaries in the format of ``potluck/coordinator/placement/scenario.py`` (one-way latency
in ms, row = sender; Gbit/s) so the planner, the link emulator and the benchmarks read the same file.

Model (all draws from one ``numpy`` generator, so a seed names a swarm):
- regions on a line of one-way backbone delays ``region_gap_ms`` apart (20-120 ms RTT across);
- per peer: download lognormal around ``download_mbit``; upload = download / U(5, 20); a share
  ``fast_share`` of peers are symmetric (upload = download, e.g. a campus or a rented server);
- each peer's last mile adds 2-12 ms one way, and a direction's delay differs from the other's by up to
  10% (asymmetric routes);
- a pair's rate a -> b is min(upload a, download b) times a backbone factor (1 inside a region, 0.6-1
  across), so a transfer is limited by the sender's uplink in almost every case.
"""

from __future__ import annotations

from typing import Any

import numpy as np

REGIONS = ("us-west", "us-east", "europe", "asia")


def home_swarm(
    n: int,
    seed: int,
    *,
    regions: int = 4,
    download_mbit: float = 200.0,
    fast_share: float = 0.1,
    region_gap_ms: float = 15.0,
    scale: float = 1.0,
    stages: int = 8,
    replicas: int = 6,
    c_dp_gb: float = 0.065,
    c_pp_gb: float = 0.02,
) -> dict[str, Any]:
    """A scenario dictionary for ``n`` home peers; ``scale`` multiplies every rate (to fit an emulator)."""
    if n < 2 or not 1 <= regions <= len(REGIONS):
        raise ValueError(f"home_swarm needs n >= 2 and 1..{len(REGIONS)} regions; got n={n}, {regions}")
    rng = np.random.default_rng(seed)
    region = rng.integers(0, regions, size=n)
    down = rng.lognormal(np.log(download_mbit), 0.6, size=n).clip(20.0, 2000.0)
    up = down / rng.uniform(5.0, 20.0, size=n)
    fast = rng.random(n) < fast_share
    up[fast] = down[fast]
    last_mile = rng.uniform(2.0, 12.0, size=n)
    gap = np.abs(region[:, None] - region[None, :]) * region_gap_ms
    lat = (gap + last_mile[:, None] + last_mile[None, :]) * rng.uniform(0.95, 1.05, size=(n, n))
    backbone = np.where(region[:, None] == region[None, :], 1.0, rng.uniform(0.6, 1.0, size=(n, n)))
    rate = np.minimum(up[:, None], down[None, :]) * backbone
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(rate, max(float(rate.max()), 1.0))
    return {
        "name": f"home-{n}-s{seed}",
        "description": f"{n} home peers in {regions} regions, uploads 5-20x below downloads (seed {seed})",
        "source": "potluck.testbed.homes.home_swarm",
        "devices": [
            {
                "id": i,
                "group": REGIONS[int(region[i])],
                "gpu": "RTX 3090 24GB",
                "upload_gbps": float(up[i]) * scale / 1e3,
                "download_gbps": float(down[i]) * scale / 1e3,
            }
            for i in range(n)
        ],
        "links": {
            "latency_ms": np.round(lat, 3).tolist(),
            "bandwidth_gbps": (rate * scale / 1e3).tolist(),
        },
        "job": {"D_PP": stages, "D_DP": replicas, "c_dp_GB": c_dp_gb, "c_pp_GB": c_pp_gb},
    }
