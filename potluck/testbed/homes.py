"""Synthetic home swarms: volunteers on asymmetric access links, spread over a few regions.

What makes a home swarm hard to plan is the access link, not the backbone: a peer uploads 5-20x slower
than it downloads, so every pair's two directions differ, and a few well-connected peers (a university,
a rented server) are worth far more than their GPU. The generator below draws such swarms from a seed,
as scenario dictionaries in the format of ``potluck/coordinator/placement/scenario.py`` (one-way latency
in ms, row = sender; Gbit/s) so the planner, the link emulator and the benchmarks read the same file.

The one model of a home's access link: ``draw_access`` (per peer) and ``pair_links`` (per pair) serve the
scenarios here and the simulator's population (``potluck/sim/population.py``) alike.

Model (a scenario's draws all come from one ``numpy`` generator, so a seed names a swarm):
- regions on a line of one-way backbone delays ``region_gap_ms`` apart (20-120 ms RTT across);
- per peer: download lognormal around ``download_mbit``; upload = download / U(5, 20); a share
  ``fast_share`` of peers are symmetric (upload = download, e.g. a campus or a rented server);
- each peer's last mile adds 2-12 ms one way, and each direction's delay is scaled by 0.95-1.05 on its
  own, so the two directions of a pair differ by up to about 10% (asymmetric routes);
- a pair's rate a -> b is min(upload a, download b) times a backbone factor (1 inside a region, 0.6-1
  across), so a transfer is limited by the sender's uplink in almost every case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

REGIONS = ("us-west", "us-east", "europe", "asia")


@dataclass(frozen=True)
class Access:
    """Each peer's access link (index = peer): the draws the model makes per peer."""

    region: np.ndarray  # int, 0 .. regions - 1
    down_mbit: np.ndarray
    up_mbit: np.ndarray
    last_mile_ms: np.ndarray  # one way


def draw_access(
    n: int, rng: np.random.Generator, regions: int, download_mbit: float, fast_share: float
) -> Access:
    """Per-peer draws, in this order from ``rng`` (the simulator draws more from it afterwards)."""
    region = rng.integers(0, regions, size=n)
    down = rng.lognormal(np.log(download_mbit), 0.6, size=n).clip(20.0, 2000.0)
    up = down / rng.uniform(5.0, 20.0, size=n)
    fast = rng.random(n) < fast_share
    up[fast] = down[fast]
    last_mile = rng.uniform(2.0, 12.0, size=n)
    return Access(region, down, up, last_mile)


def pair_links(
    access: Access, ids: np.ndarray, region_gap_ms: float, u_jitter: np.ndarray, u_across: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(one-way latency ms, rate; row = sender) among peers ``ids``, the rate in the unit of ``access``'s
    rates (Mbit/s as drawn), from per-pair U(0, 1) draws:
    ``u_jitter`` (per direction) scales a direction's delay by 0.95-1.05, ``u_across`` (symmetric) a
    cross-region pair's rate by 0.6-1. Where the uniforms come from is the caller's: a generator for a
    scenario, a counter-based hash for the simulator's 10,000 peers (``sim/population.py``)."""
    r = access.region[ids]
    lm = access.last_mile_ms[ids]
    gap = np.abs(r[:, None] - r[None, :]) * region_gap_ms
    lat = (gap + lm[:, None] + lm[None, :]) * (0.95 + 0.1 * u_jitter)
    backbone = np.where(r[:, None] == r[None, :], 1.0, 0.6 + 0.4 * u_across)
    rate = np.minimum(access.up_mbit[ids][:, None], access.down_mbit[ids][None, :]) * backbone
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(rate, max(float(rate.max()), 1.0))
    return lat, rate


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
    acc = draw_access(n, rng, regions, download_mbit, fast_share)
    region, down, up = acc.region, acc.down_mbit, acc.up_mbit
    u_jitter = rng.random((n, n))
    u_across = rng.random((n, n))
    lat, rate = pair_links(acc, np.arange(n), region_gap_ms, u_jitter, u_across)
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
