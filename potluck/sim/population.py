"""Who the volunteers are: a hardware mix and home access links, per peer, drawn from a seed.

The link model is the one home-link model of ``potluck.testbed.homes`` (the planner's and the link
emulator's home swarms): the same per-peer draws (``draw_access``) and the same per-pair formula
(``pair_links``). Only the per-pair uniforms come from elsewhere: a counter-based hash of (seed, a, b),
so a pair looks the same in every subset it appears in and a 10,000-peer swarm never needs its 10^8
pairs (the coordinator only ever builds the link matrices of the peers it plans over,
``planning_state``).

GPU mix (effective dense TFLOP/s on training kernels, about 40-50% of datasheet peak, as in
``placement/scenario.py``; shares are our assumption for consumer volunteers, not a measurement).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from potluck.coordinator.placement.costmodel import DeviceSpec
from potluck.coordinator.placement.netmodel import from_matrices
from potluck.coordinator.placement.types import PlanningState
from potluck.sim.errors import SimError
from potluck.testbed.homes import Access, draw_access, pair_links

logger = logging.getLogger(__name__)

# (name, share, effective TFLOP/s, memory GB)
GPU_MIX: tuple[tuple[str, float, float, float], ...] = (
    ("RTX 2080 Ti", 0.10, 20.0, 11.0),
    ("RTX 3060", 0.30, 13.0, 12.0),
    ("RTX 3090", 0.30, 35.0, 24.0),
    ("RTX 4090", 0.22, 80.0, 24.0),
    ("A100 40GB", 0.08, 150.0, 40.0),
)
_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True)
class Population:
    """Per-peer attributes of `n` identities (index = identity id)."""

    seed: int
    region: np.ndarray  # int
    up_gbps: np.ndarray
    down_gbps: np.ndarray
    last_mile_ms: np.ndarray
    tflops: np.ndarray
    memory_gb: np.ndarray
    gpu: np.ndarray  # index into GPU_MIX
    region_gap_ms: float = 15.0

    @property
    def n(self) -> int:
        return len(self.region)

    def describe(self) -> dict[str, Any]:
        shares = np.bincount(self.gpu, minlength=len(GPU_MIX)) / max(self.n, 1)
        return {
            "identities": self.n,
            "gpu_shares": {GPU_MIX[k][0]: round(float(s), 3) for k, s in enumerate(shares)},
            "download_mbit_median": round(float(np.median(self.down_gbps)) * 1e3, 1),
            "upload_mbit_median": round(float(np.median(self.up_gbps)) * 1e3, 1),
        }


def make_population(
    n: int,
    rng: np.random.Generator,
    *,
    regions: int = 4,
    download_mbit: float = 200.0,
    fast_share: float = 0.1,
    region_gap_ms: float = 15.0,
) -> Population:
    if n < 2 or regions < 1:
        raise SimError(f"a population needs n >= 2 and >= 1 region; got n={n}, regions={regions}")
    seed = int(rng.integers(0, 2**62))
    acc = draw_access(n, rng, regions, download_mbit, fast_share)
    region, down, up, last_mile = acc.region, acc.down_mbit, acc.up_mbit, acc.last_mile_ms
    shares = np.array([g[1] for g in GPU_MIX])
    gpu = rng.choice(len(GPU_MIX), size=n, p=shares / shares.sum())
    tflops = np.array([GPU_MIX[k][2] for k in gpu]) * rng.uniform(0.85, 1.15, size=n)
    memory = np.array([GPU_MIX[k][3] for k in gpu])
    return Population(seed, region, up / 1e3, down / 1e3, last_mile, tflops, memory, gpu, region_gap_ms)


def _pair_uniform(seed: int, a: np.ndarray, b: np.ndarray, salt: int) -> np.ndarray:
    """U(0, 1) per (a, b), from splitmix64 of (seed, a, b, salt): stable whatever subset asks."""
    with np.errstate(over="ignore"):
        base = (np.uint64(seed) ^ (np.uint64(salt) * np.uint64(0x9E3779B97F4A7C15))) & _MASK
        x: np.ndarray = np.asarray(
            base
            + a.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
            + b.astype(np.uint64) * np.uint64(0x94D049BB133111EB),
            dtype=np.uint64,
        )
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return np.asarray((x >> np.uint64(11)).astype(np.float64) / float(1 << 53))


def link_matrices(pop: Population, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(one-way latency ms, rate Gbit/s; row = sender) among peers `ids`."""
    ids = np.asarray(ids, dtype=np.int64)
    a, b = ids[:, None], ids[None, :]
    u_jitter = _pair_uniform(pop.seed, a, b, 1)
    u_across = _pair_uniform(pop.seed, np.minimum(a, b), np.maximum(a, b), 2)
    access = Access(pop.region, pop.down_gbps, pop.up_gbps, pop.last_mile_ms)
    return pair_links(access, ids, pop.region_gap_ms, u_jitter, u_across)


def planning_state(pop: Population, ids: np.ndarray, tflops_scale: np.ndarray | None = None) -> PlanningState:
    """The planner's view of peers `ids` (identity ids become the peer ids).

    `tflops_scale` (per peer, in (0, 1]) lets a churn-aware wrapper discount peers it expects to lose.
    """
    ids = np.asarray(ids, dtype=np.int64)
    lat, rate = link_matrices(pop, ids)
    net = from_matrices(lat, rate, pop.up_gbps[ids], pop.down_gbps[ids])
    scale = np.ones(len(ids)) if tflops_scale is None else tflops_scale
    devices = tuple(
        DeviceSpec(float(pop.tflops[k] * s), float(pop.memory_gb[k])) for k, s in zip(ids, scale, strict=True)
    )
    return PlanningState(tuple(int(k) for k in ids), devices, net)
