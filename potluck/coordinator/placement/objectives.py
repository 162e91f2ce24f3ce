"""Objectives the search optimises, in the form it needs.

The search sees a placement as S stage groups of R devices (plus unused spares). An objective provides
the pipeline link weight of every device pair (used for bottleneck matching between stage groups and for
the stage order), a summary of one stage group (`group_stat`), and `combine`, which turns the summaries
and the matched link times, both in pipeline order, into the objective value in seconds. A swap of two
devices then changes two summaries and at most four matched links, which is what makes local search
cheap.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from potluck.coordinator.placement.costmodel import (
    DeviceSpec,
    DtfmJob,
    StepBreakdown,
    StepJob,
    dtfm_weights,
    is_symmetric,
    link_weight,
    micro_batches,
    split_layers,
    step_time,
    sync_weights,
)
from potluck.coordinator.placement.matching import bottleneck_matching, split_bottleneck_matching
from potluck.coordinator.placement.netmodel import NetModel


def _partner_floor(w: np.ndarray) -> float:
    """Every row and every column of a matching takes some entry: the largest row or column minimum."""
    return max(float(w.min(axis=1).max()), float(w.min(axis=0).max()))


class Objective(ABC):
    """What the search minimises; `link` is the N x N pipeline link weight (seconds, symmetric).

    A stage boundary between groups A (earlier) and B costs `boundary(A, B)`: by default the bottleneck
    matching on `link`, which is exact where `link` says all there is to say about a pair. `link` is
    also what the templates cluster on, and a lower bound of a boundary's matched pairs.
    """

    name: str
    n_stages: int
    n_replicas: int
    link: np.ndarray
    monotone_in_links = False  # True if a longer link can never lower the objective (enables pruning)

    def boundary(self, a: np.ndarray, b: np.ndarray) -> tuple[float, list[int]]:
        """(Matched link time, the column of b matched to each row of a) between stage groups a and b."""
        return bottleneck_matching(self.link[a[:, None], b])

    def boundary_floor(self, a: np.ndarray, b: np.ndarray) -> float:
        """A cheap lower bound of ``boundary(a, b)[0]``: every device needs some partner."""
        return _partner_floor(self.link[a[:, None], b])

    @abstractmethod
    def group_stat(self, members: np.ndarray) -> Any:
        """Summary of one stage group (device ids in any order)."""

    @abstractmethod
    def combine(self, stats: Sequence[Any], edges: np.ndarray) -> float:
        """Objective value from group summaries and matched link times, both in pipeline order."""

    @abstractmethod
    def badness(self, stat: Any) -> float:
        """A scalar saying how much this group hurts (to aim moves at the worst groups)."""


class DtfmObjective(Objective):
    """DT-FM's COMM-COST: slowest group's shard sends plus twice the matched path (seconds).

    `w_dp` and `w_pp` are directional (row = sender). On an asymmetric network a boundary's cost is the
    mean of its slowest forward and slowest backward transfer, matched exactly for that sum
    (``split_bottleneck_matching``); `link`, their mean per pair, bounds it from below.
    """

    name = "dtfm"
    monotone_in_links = True

    def __init__(self, net: NetModel, job: DtfmJob) -> None:
        self.n_stages, self.n_replicas = job.n_stages, job.n_replicas
        self.w_dp, self.w_pp = dtfm_weights(net, job)
        self.directional = not is_symmetric(net)
        self.link = (self.w_pp + self.w_pp.T) / 2.0 if self.directional else self.w_pp

    def boundary(self, a: np.ndarray, b: np.ndarray) -> tuple[float, list[int]]:
        if not self.directional:
            return super().boundary(a, b)
        total, col_of_row = split_bottleneck_matching(self.w_pp[a[:, None], b], self.w_pp[b[:, None], a].T)
        return total / 2.0, col_of_row

    def boundary_floor(self, a: np.ndarray, b: np.ndarray) -> float:
        if not self.directional:
            return super().boundary_floor(a, b)
        fwd, bwd = self.w_pp[a[:, None], b], self.w_pp[b[:, None], a].T
        split = (_partner_floor(fwd) + _partner_floor(bwd)) / 2.0
        return max(split, _partner_floor((fwd + bwd) / 2.0))

    def group_stat(self, members: np.ndarray) -> float:
        return float(self.w_dp[members[:, None], members].sum(axis=1).max())

    def combine(self, stats: Sequence[Any], edges: np.ndarray) -> float:
        return float(max(stats)) + 2.0 * float(edges.sum())

    def badness(self, stat: Any) -> float:
        return float(stat)


class StepObjective(Objective):
    """Our step time (costmodel.step_time) for a fixed shape S x R."""

    name = "step"

    def __init__(
        self, net: NetModel, devices: Sequence[DeviceSpec], job: StepJob, n_stages: int, n_replicas: int
    ) -> None:
        self.n_stages, self.n_replicas, self.job = n_stages, n_replicas, job
        self._splits: dict[bytes, np.ndarray | None] = {}
        self.link = link_weight(net, job)
        self.sync_lat, self.sync_per_byte = sync_weights(net, job)
        self.speed = np.array([d.tflops for d in devices], dtype=np.float64)
        self.memory = np.array([d.memory_gb for d in devices], dtype=np.float64)
        # A member's access link caps how fast it pushes its shards out and takes the others' in: (R-1)
        # shards each way in each of the two phases, compressed as on a WAN link (access capacities
        # describe the path to the internet). Up and down run at once (full duplex): the slower sets it.
        slowest = np.minimum(net.upload_gbps, net.download_gbps)
        ratio = job.codecs.gradient_wan
        self.access_per_byte = np.where(
            np.isfinite(slowest), 2.0 * (n_replicas - 1) * ratio * 8.0 / (slowest * 1e9), 0.0
        )

    def group_stat(self, members: np.ndarray) -> tuple[float, float, np.ndarray, np.ndarray]:
        grid = np.ix_(members, members)
        # Each member sends its shards over its own links (row sums) and receives the others' (column
        # sums) at the same time: the slower of the two, or of its access link, sets its sync time.
        sends, receives = self.sync_per_byte[grid].sum(axis=1), self.sync_per_byte[grid].sum(axis=0)
        per_byte = np.maximum(np.maximum(sends, receives), self.access_per_byte[members])
        return (
            float(self.speed[members].min()),
            float(self.memory[members].min()),
            self.sync_lat[grid].sum(axis=1),
            per_byte,
        )

    def breakdown(self, stats: Sequence[Any], edges: np.ndarray) -> StepBreakdown:
        speed = np.array([s[0] for s in stats])
        memory = np.array([s[1] for s in stats])
        lat = np.stack([s[2] for s in stats])
        per_byte = np.stack([s[3] for s in stats])
        # The layer split depends only on the stages' slowest speed and smallest memory, which most
        # moves leave unchanged: remember it.
        key = speed.tobytes() + memory.tobytes()
        if key not in self._splits:
            if len(self._splits) > 50_000:
                self._splits.clear()
            s = len(stats)
            in_flight = np.minimum(micro_batches(self.job, self.n_replicas), s - np.arange(s))
            self._splits[key] = split_layers(self.job, speed, memory, in_flight)
        return step_time(speed, memory, edges, lat, per_byte, self.job, self.n_replicas, self._splits[key])

    def combine(self, stats: Sequence[Any], edges: np.ndarray) -> float:
        return self.breakdown(stats, edges).total

    def badness(self, stat: Any) -> float:
        return 1.0 / float(stat[0])  # slow stages first


def fixed_breakdown(
    net: NetModel, devices: Sequence[DeviceSpec], job: StepJob, grid: Sequence[Sequence[int]]
) -> StepBreakdown:
    """The step-time model of one placement as it stands: ``grid[j][i]`` the ``net`` row of the peer
    running stage j of pipeline i, stages in pipeline order, pipelines matched by column (no search)."""
    rows = [np.asarray(row, dtype=np.int64) for row in grid]
    obj = StepObjective(net, devices, job, len(rows), len(rows[0]))
    edges = np.array([float(obj.link[a, b].max()) for a, b in itertools.pairwise(rows)])
    return obj.breakdown([obj.group_stat(row) for row in rows], edges)
