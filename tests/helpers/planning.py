"""Small random swarms for planner tests."""

from __future__ import annotations

import numpy as np

from potluck.coordinator.placement import PlanningState
from potluck.coordinator.placement.costmodel import DeviceSpec, StepJob, layer_memory, peers_to_hold
from potluck.coordinator.placement.netmodel import NetModel, from_matrices


def clustered_net(n: int, clusters: int, seed: int) -> NetModel:
    """Peers in `clusters` sites: 1 ms / 10 Gbit/s inside, 20-80 ms / 0.2-1 Gbit/s across."""
    rng = np.random.default_rng(seed)
    site = np.arange(n) % clusters
    far_lat = rng.uniform(20, 80, (clusters, clusters))
    far_bw = rng.uniform(0.2, 1.0, (clusters, clusters))
    far_lat, far_bw = (far_lat + far_lat.T) / 2, (far_bw + far_bw.T) / 2
    lat = np.where(site[:, None] == site[None], 1.0, far_lat[site][:, site])
    bw = np.where(site[:, None] == site[None], 10.0, far_bw[site][:, site])
    np.fill_diagonal(lat, 0.0)
    return from_matrices(lat, bw)


def clustered_state(n: int, clusters: int, seed: int, tflops: list[float] | None = None) -> PlanningState:
    speeds = tflops or [50.0] * n
    return PlanningState(
        tuple(f"p{i}" for i in range(n)),
        tuple(DeviceSpec(speeds[i % len(speeds)], 24.0) for i in range(n)),
        clustered_net(n, clusters, seed),
    )


def memory_for(job: StepJob, peers: int) -> int:
    """Device memory (bytes) with which ``peers - 1`` peers cannot hold ``job``'s model as one pipeline
    and ``peers`` can (``peers_to_hold``, which the planner agrees with): a swarm short of memory."""
    state, act = layer_memory(job)
    step = (state + act) / 20
    mem = (job.model.embed_params * job.bytes_per_param + state + act) / job.memory_headroom
    while peers_to_hold(job, [mem / 1e9] * (peers - 1)) != peers:
        mem += step
        assert mem < 1e12, f"no memory makes exactly {peers} peers needed"
    return int(mem) + 1
