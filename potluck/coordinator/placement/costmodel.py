"""Cost models of a placement: DT-FM's COMM-COST and our step time.

A placement is `stages[j][i]`: the device running stage j of pipeline i, rows in pipeline order.

`objective="dtfm"` reproduces the communication cost of Yuan et al. (NeurIPS 2022) exactly, so results
compare with their scheduler on their cases. Links are directional: row = sender. Where a network is
asymmetric (home links upload 5-20x slower than they download), every transfer is costed over the
direction it flows: activations a -> b, their gradients b -> a, each peer's shard sends over its own
uplink; on a symmetric network this is DT-FM's formula to the bit.

`objective="step"` is our model of one training step: 1F1B pipeline time from per-stage compute (the
slowest replica of a stage sets its pace) and activation transfers over the matched links, plus the
data-parallel gradient sync that does not overlap the backward pass, with memory feasibility and uneven
layer splits. All times in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from potluck.coordinator.placement.netmodel import NetModel
from potluck.protocol.jobspec import ModelSpec

GB = 1e9  # DT-FM's sizes are in 1e9 bytes; so are ours
INFEASIBLE = math.inf


@dataclass(frozen=True)
class DtfmJob:
    """DT-FM's job constants: fixed shape and the two transfer volumes (1e9 bytes)."""

    n_stages: int
    n_replicas: int
    c_dp_gb: float  # one stage's gradients
    c_pp_gb: float  # one macro-batch's activations at a stage boundary


def directed_bandwidth(net: NetModel) -> np.ndarray:
    """Gbit/s from row to column: the pair's rate, capped by the sender's upload and receiver's download."""
    bw = np.minimum(net.bandwidth_gbps, net.upload_gbps[:, None])
    return np.minimum(bw, net.download_gbps[None, :])


def is_symmetric(net: NetModel) -> bool:
    """True where both directions of every pair look the same (DT-FM's undirected graph is exact)."""
    bw = directed_bandwidth(net)
    return bool(np.array_equal(net.latency_ms, net.latency_ms.T) and np.array_equal(bw, bw.T))


def dtfm_weights(net: NetModel, job: DtfmJob) -> tuple[np.ndarray, np.ndarray]:
    """Per ordered pair (row = sender), seconds: the DP weight (the sender's two shard sends, one per
    all-reduce phase) and the pipeline weight (one macro-batch's activations, or their gradients)."""
    lat = net.latency_ms / 1e3
    bw = directed_bandwidth(net)
    w_dp = 2.0 * (lat + job.c_dp_gb * 8.0 / (bw * job.n_replicas))
    np.fill_diagonal(w_dp, 0.0)
    w_pp = lat + job.c_pp_gb * 8.0 / bw
    return w_dp, w_pp


@dataclass(frozen=True)
class DtfmBreakdown:
    dp: float  # max over stage groups of the slowest member's serial shard sends
    pp: float  # sum over stage boundaries of the slowest matched link, averaged over the two directions
    total: float  # dp + 2 * pp: forward activations a -> b plus backward gradients b -> a


def dtfm_cost(stages: np.ndarray, net: NetModel, job: DtfmJob) -> DtfmBreakdown:
    """COMM-COST of a fixed layout, with its own matching and order (no optimisation), direction by
    direction: a boundary costs its slowest forward transfer plus its slowest backward one."""
    grid = np.asarray(stages, dtype=np.int64)
    w_dp, w_pp = dtfm_weights(net, job)
    dp = max(float(w_dp[np.ix_(row, row)].sum(axis=1).max()) for row in grid)
    pp = 0.0
    for j in range(grid.shape[0] - 1):
        a, b = grid[j], grid[j + 1]
        pp += (float(w_pp[a, b].max()) + float(w_pp[b, a].max())) / 2.0
    return DtfmBreakdown(dp, pp, dp + 2.0 * pp)


# --------------------------------------------------------------------------------------------------
# Step-time model


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer. Built from a job's ``ModelSpec`` (``from_spec``), it asks the spec, which
    shapes the real transformer too; scenario shapes (DT-FM's GPT) have a two-matrix ``ffn_mult * d`` MLP."""

    layers: int
    d_model: int
    heads: int
    vocab: int
    seq_len: int
    ffn_mult: float = 4.0  # MLP width / d_model; ignored when ``spec`` is set
    spec: ModelSpec | None = None

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> ModelShape:
        return cls(spec.n_layers, spec.d_model, spec.n_heads, spec.vocab_size, spec.seq_len, spec=spec)

    @property
    def params_per_layer(self) -> float:
        """Matrix weights of one layer; norms and biases are negligible."""
        if self.spec is not None:
            return float(self.spec.matmul_params_per_layer)
        # attention q,k,v,o (4 d^2) + MLP (2 * ffn_mult * d^2)
        return (4.0 + 2.0 * self.ffn_mult) * self.d_model**2

    @property
    def flops_per_token_layer(self) -> float:
        """Forward FLOPs per token of one layer: 2 per weight, plus attention scores and mixing."""
        if self.spec is not None:
            return float(self.spec.layer_flops_per_token)
        return 2.0 * self.params_per_layer + 4.0 * self.seq_len * self.d_model

    @property
    def embed_params(self) -> float:
        """One vocab x d table: the embedding, and again the LM head."""
        return float(self.spec.embed_params if self.spec is not None else self.vocab * self.d_model)

    @property
    def side_params(self) -> float:
        """The token table a stage after the first holds at a bottleneck it receives
        (``model.bottleneck_tokens``: one more vocab x d table); 0 without one. Counted for every
        stage after the first, an upper bound where a cut falls at no position."""
        return self.embed_params if self.spec is not None and self.spec.bottleneck_tokens else 0.0


@dataclass(frozen=True)
class BatchSpec:
    sequences_per_step: int  # global batch
    micro_batch: int  # sequences per micro-batch


@dataclass(frozen=True)
class CodecRatios:
    """Bytes on the wire per byte of fp16 payload, by link kind (LAN: bandwidth >= lan_gbps)."""

    activation_lan: float = 1.0
    activation_wan: float = 1.0
    gradient_lan: float = 1.0
    gradient_wan: float = 1.0
    lan_gbps: float = 10.0
    # DiLoCo local steps: the gradient ratios above are per step (a sync's bytes / ``sync_every``); with
    # ``overlap_sync`` each sync runs under the next ``overlap_steps`` steps' pipelines, and only what
    # outlasts them is exposed
    sync_every: int = 1
    overlap_sync: bool = False
    overlap_steps: int = 1


@dataclass(frozen=True)
class DeviceSpec:
    """A peer's measured effective compute (TFLOP/s on our kernels) and its memory."""

    tflops: float
    memory_gb: float


@dataclass(frozen=True)
class StepJob:
    """Everything the step-time model needs about the job."""

    model: ModelShape
    batch: BatchSpec
    codecs: CodecRatios = field(default_factory=CodecRatios)
    bytes_per_param: float = 16.0  # fp16 weights + grads, fp32 master + Adam moments
    recompute: bool = True  # activation checkpointing: keep layer inputs, recompute the rest
    memory_headroom: float = 0.9  # fraction of device memory the planner may fill


@dataclass(frozen=True)
class StepBreakdown:
    total: float
    pipeline: float  # 1F1B fill + steady state + drain
    dp_exposed: float  # gradient sync not hidden under the backward pass
    stage_compute: tuple[float, ...]  # per stage (pipeline order), slowest replica, per micro-batch
    link: tuple[float, ...]  # per boundary, slowest matched link, one direction, per micro-batch
    dp_sync: tuple[float, ...]  # per stage
    layers: tuple[int, ...]  # layer split in pipeline order
    micro_batches: int
    feasible: bool
    commit: float = 0.0  # the step commit's round trip to the plan's leader (``predict_step`` adds it)


def micro_batch_flops(job: StepJob) -> tuple[float, float]:
    """(FLOPs of one layer, FLOPs of the LM head) for one micro-batch, forward + backward (+ recompute)."""
    m = job.model
    tokens = job.batch.micro_batch * m.seq_len
    work = (4.0 if job.recompute else 3.0) * m.flops_per_token_layer * tokens
    return work, 3.0 * 2.0 * m.embed_params * tokens


def micro_batches(job: StepJob, n_replicas: int) -> int:
    return max(1, math.ceil(job.batch.sequences_per_step / (n_replicas * job.batch.micro_batch)))


def activation_bytes(job: StepJob) -> float:
    """fp16 activations of one micro-batch crossing a stage boundary (bytes)."""
    return 2.0 * job.batch.micro_batch * job.model.seq_len * job.model.d_model


def link_weight(net: NetModel, job: StepJob) -> np.ndarray:
    """Transfer time of one micro-batch's activations (or their gradients) per pair (s), the slower of the
    two directions: in 1F1B's steady state both directions carry one transfer per slot at once."""
    bw = directed_bandwidth(net)
    c = job.codecs
    ratio = np.where(bw >= c.lan_gbps, c.activation_lan, c.activation_wan)
    one_way = net.latency_ms / 1e3 + activation_bytes(job) * ratio * 8.0 / (bw * GB)
    return np.maximum(one_way, one_way.T)


def sync_weights(net: NetModel, job: StepJob) -> tuple[np.ndarray, np.ndarray]:
    """Per ordered pair (row = sender): latency part (s, both directions) and seconds per byte of gradient
    shard the sender sends the receiver over the all-reduce's two phases."""
    lat = (net.latency_ms + net.latency_ms.T) / 1e3
    bw = directed_bandwidth(net)
    c = job.codecs
    ratio = np.where(bw >= c.lan_gbps, c.gradient_lan, c.gradient_wan)
    per_byte = 2.0 * ratio * 8.0 / (bw * GB)
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(per_byte, 0.0)
    return lat, per_byte


def layer_memory(job: StepJob) -> tuple[float, float]:
    """(bytes of state per layer, bytes of activations per layer per in-flight micro-batch)."""
    m, b = job.model, job.batch.micro_batch
    state = m.params_per_layer * job.bytes_per_param
    if job.recompute:
        act = 2.0 * b * m.seq_len * m.d_model  # only the layer input is kept
    else:
        # Korthikanti et al. (2022) estimate for a transformer layer without recomputation.
        act = b * m.seq_len * m.d_model * (34.0 + 5.0 * m.heads * m.seq_len / m.d_model)
    return state, act


def peers_to_hold(job: StepJob, memory_gb: Sequence[float]) -> int | None:
    """The fewest peers that together hold the model as one pipeline (1F1B: stage j keeps
    ``min(micro-batches, k - j)`` micro-batches' activations), the largest memories on the first
    stages and, past the ``memory_gb`` given (the live peers), more like the largest: what a job short
    of memory waits for. None: no pipeline would (a stage holds at least one layer, so it has at most
    as many stages as the model has layers)."""
    if not memory_gb:
        return None
    mem = sorted(memory_gb, reverse=True)
    mb = micro_batches(job, 1)
    for k in range(1, job.model.layers + 1):
        have = np.array((mem + [mem[0]] * k)[:k], dtype=np.float64)
        caps = memory_caps(job, have, np.minimum(mb, k - np.arange(k)))
        if caps.min() >= 1 and int(caps.sum()) >= job.model.layers:
            return k
    return None


def memory_caps(job: StepJob, memory_gb: np.ndarray, in_flight: np.ndarray) -> np.ndarray:
    """The most layers each stage (pipeline order) holds in memory: its state and activations for
    ``in_flight`` micro-batches per layer, after the embedding (first stage) and head (last), within
    ``memory_headroom`` of ``memory_gb``; -1 where not even the embedding or head fits."""
    m = job.model
    state, act = layer_memory(job)
    mem_extra = np.zeros(len(memory_gb))
    mem_extra[0] += m.embed_params * job.bytes_per_param
    mem_extra[-1] += m.embed_params * job.bytes_per_param
    mem_extra[1:] += m.side_params * job.bytes_per_param
    budget = memory_gb * GB * job.memory_headroom - mem_extra
    # No stage holds more than the whole model: capping here keeps every count in int64 whatever
    # memory peers claim.
    return np.clip(np.floor(budget / (state + act * in_flight)), -1, m.layers).astype(np.int64)


def split_layers(
    job: StepJob, speed_tflops: np.ndarray, memory_gb: np.ndarray, in_flight: np.ndarray
) -> np.ndarray | None:
    """Layers per stage (pipeline order) minimising the slowest stage; None if memory cannot fit.

    Binary search on the stage time T: each stage takes as many layers as it computes within T and
    holds in memory; the smallest T whose capacities cover all layers wins.
    """
    m = job.model
    s = len(speed_tflops)
    work, head = micro_batch_flops(job)
    extra = np.zeros(s)  # embedding on the first stage, LM head on the last (FLOPs per micro-batch)
    extra[-1] += head
    # capped at the whole model, which also keeps the give-back loop below short (<= stages x layers)
    mem_cap = memory_caps(job, memory_gb, in_flight)
    if (mem_cap < 1).any() or mem_cap.sum() < m.layers:
        return None
    rate = speed_tflops * 1e12

    def capacity(t: np.ndarray) -> np.ndarray:
        # The 1e-9 absorbs rounding: a stage that fits k layers in exactly t must get k, not k - 1.
        fits = np.clip(np.floor((t[..., None] * rate - extra) / work + 1e-9), -1, m.layers)
        return np.minimum(fits, mem_cap).astype(np.int64)

    # The best stage time is the time some stage needs for some whole number of layers: try them all
    # at once and keep the smallest whose capacities cover the model.
    counts = np.arange(1, m.layers + 1)
    times = np.unique(((extra[:, None] + work * counts[None, :]) / rate[:, None]).ravel())
    caps = capacity(times)
    ok = (caps >= 1).all(axis=1) & (caps.sum(axis=1) >= m.layers)
    hi = float(times[int(np.argmax(ok))]) if ok.any() else float(times[-1])
    cap = np.maximum(capacity(np.array(hi)), 1)
    # Give back surplus layers from the stages with the most time slack.
    while cap.sum() > m.layers:
        slack = hi - (extra + work * cap) / rate
        slack[cap <= 1] = -np.inf
        cap[int(np.argmax(slack))] -= 1
    return cap


def step_time(
    order_speed: np.ndarray,
    order_memory: np.ndarray,
    links: np.ndarray,
    sync_lat: np.ndarray,
    sync_per_byte: np.ndarray,
    job: StepJob,
    n_replicas: int,
    layers: np.ndarray | None = None,
    run_ahead: int = 0,
    latency: np.ndarray | None = None,
) -> StepBreakdown:
    """Step time from per-stage summaries in pipeline order.

    Each boundary's one-way ``latency`` (s; None: not priced) with ``run_ahead`` (extra micro-batches in
    flight per stage): stage j keeps S - j + run_ahead micro-batches in flight, so a boundary's round trip
    (both transfers and the compute on its two sides) is spread over that many micro-batches, and only
    its bandwidth part must fit in a slot. Without run-ahead this is 1F1B's own cost of latency: two
    balanced stages of slot c over a link of one-way l take c + l per micro-batch, not c.

    order_speed/order_memory: slowest replica's TFLOP/s and smallest memory per stage; links: bottleneck
    matched link per boundary (s per micro-batch, one direction); sync_lat/sync_per_byte: per stage and
    member, the member's summed latency and seconds-per-byte to the rest of its group (sharded all-reduce
    where each member owns 1/R of the gradients and exchanges shards with every other member in turn).
    """
    s = len(order_speed)
    mb = micro_batches(job, n_replicas)
    in_flight = np.minimum(mb, s - np.arange(s))
    if layers is None:
        layers = split_layers(job, order_speed, order_memory, in_flight)
    if layers is None:
        empty = tuple(0.0 for _ in range(s))
        return StepBreakdown(INFEASIBLE, INFEASIBLE, 0.0, empty, tuple(links), empty, (), mb, False)
    m = job.model
    work, head = micro_batch_flops(job)
    extra = np.zeros(s)
    extra[-1] += head
    compute = (extra + work * layers) / (order_speed * 1e12)
    slot = max(float(compute.max()), float(links.max()) if len(links) else 0.0)
    if latency is not None and len(links):
        window = s - np.arange(s - 1) + run_ahead  # micro-batches in flight on the boundary's first stage
        cycle = (2.0 * links + compute[:-1] + compute[1:]) / window
        transfer = np.maximum(links - latency, 0.0)
        slot = max(float(compute.max()), float(transfer.max()), float(cycle.max()))
    pipeline = float(compute.sum() + 2.0 * links.sum() + (mb - 1) * slot)
    # Stage j's gradients are final once its last backward ends; stages before it still have their
    # backward (2/3 of compute) and the gradient transfers back to do, which hides part of the sync.
    grad_bytes = 2.0 * (m.params_per_layer * layers + np.where(np.arange(s) == 0, m.embed_params, 0.0))
    grad_bytes[-1] += m.embed_params if s > 1 else 0.0
    grad_bytes[1:] += 2.0 * m.side_params
    shard = grad_bytes / n_replicas
    sync = (sync_lat + shard[:, None] * sync_per_byte).max(axis=1)
    hidden = np.concatenate([[0.0], np.cumsum(compute * 2.0 / 3.0 + np.append(links, 0.0))[:-1]])
    exposed = float(np.maximum(sync - hidden, 0.0).max())
    h = job.codecs.sync_every
    if h > 1 and job.codecs.overlap_sync:
        # one whole sync every h steps (the per-byte ratio is a sync's over h), under the next pipelines
        whole = float((sync_lat + h * shard[:, None] * sync_per_byte).max())
        exposed = max(0.0, whole - job.codecs.overlap_steps * pipeline) / h
    return StepBreakdown(
        pipeline + exposed,
        pipeline,
        exposed,
        tuple(compute.tolist()),
        tuple(links.tolist()),
        tuple(sync.tolist()),
        tuple(int(x) for x in layers),
        mb,
        True,
    )
