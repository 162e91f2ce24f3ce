"""Cost models: DT-FM's COMM-COST by hand, step time's structure and memory feasibility."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from potluck.coordinator.job.plan import step_job
from potluck.coordinator.placement.costmodel import (
    BatchSpec,
    DtfmJob,
    ModelShape,
    StepJob,
    dtfm_cost,
    memory_caps,
    micro_batches,
    split_layers,
    step_time,
)
from potluck.coordinator.placement.netmodel import from_matrices
from potluck.protocol.jobspec import JobSpec, ModelSpec


def test_dtfm_cost_matches_hand_computation() -> None:
    lat = np.array([[0, 10, 20, 30], [10, 0, 40, 50], [20, 40, 0, 60], [30, 50, 60, 0]], dtype=float)
    bw = np.array([[1, 1, 2, 4], [1, 1, 5, 2], [2, 5, 1, 1], [4, 2, 1, 1]], dtype=float)
    net = from_matrices(lat, bw)
    job = DtfmJob(n_stages=2, n_replicas=2, c_dp_gb=1.0, c_pp_gb=0.5)
    stages = np.array([[0, 1], [2, 3]])  # stage 0 on devices 0, 1; pipelines 0->2 and 1->3
    got = dtfm_cost(stages, net, job)
    dp0 = 2 * (0.010 + 8.0 / (1 * 2))  # the pair (0, 1): both members see the same sum
    dp1 = 2 * (0.060 + 8.0 / (1 * 2))
    pp = max(0.020 + 4.0 / 2, 0.050 + 4.0 / 2)
    assert got.dp == pytest.approx(max(dp0, dp1))
    assert got.pp == pytest.approx(pp)
    assert got.total == pytest.approx(max(dp0, dp1) + 2 * pp)


def _job(layers: int = 24, recompute: bool = True) -> StepJob:
    return StepJob(ModelShape(layers, 1024, 16, 32000, 1024), BatchSpec(64, 1), recompute=recompute)


def test_layer_split_follows_speed_and_covers_all_layers() -> None:
    job = _job()
    layers = split_layers(job, np.array([100.0, 50.0, 50.0, 100.0]), np.full(4, 80.0), np.array([4, 3, 2, 1]))
    assert layers is not None
    assert int(layers.sum()) == 24
    assert layers[0] > layers[1] and layers[3] >= layers[2]


def test_layer_split_respects_memory() -> None:
    job = _job(recompute=False)
    roomy = split_layers(job, np.array([100.0, 100.0]), np.array([80.0, 80.0]), np.array([2, 1]))
    assert roomy is not None
    tight = split_layers(job, np.array([100.0, 100.0]), np.array([0.5, 0.5]), np.array([2, 1]))
    assert tight is None


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 48),
    speeds=st.lists(st.floats(1.0, 400.0), min_size=1, max_size=12),
)
def test_layer_split_always_places_every_layer(layers: int, speeds: list[float]) -> None:
    job = _job(layers=max(layers, len(speeds)))
    s = len(speeds)
    got = split_layers(job, np.array(speeds), np.full(s, 80.0), np.arange(s, 0, -1))
    assert got is not None
    assert int(got.sum()) == job.model.layers and (got >= 1).all()


def test_step_time_of_a_uniform_pipeline_by_hand() -> None:
    job = _job(layers=4)
    s, r = 2, 2
    m = micro_batches(job, r)  # 64 sequences / (2 replicas x 1) = 32
    link = 0.01
    out = step_time(
        np.array([100.0, 100.0]),
        np.array([80.0, 80.0]),
        np.array([link]),
        np.zeros((s, r)),
        np.zeros((s, r)),
        job,
        r,
    )
    mdl = job.model
    work = 4.0 * mdl.flops_per_token_layer * mdl.seq_len  # recompute: forward x4, micro-batch of 1
    head = 3.0 * 2.0 * mdl.embed_params * mdl.seq_len  # the LM head weighs on the last stage...
    assert head > work
    assert (
        out.feasible and out.layers == (3, 1) and out.micro_batches == m == 32
    )  # ...so it gets fewer layers
    t0, t1 = 3 * work / 100e12, (1 * work + head) / 100e12
    assert out.pipeline == pytest.approx(t0 + t1 + 2 * link + (m - 1) * max(t0, t1, link))
    assert out.dp_exposed == 0.0 and out.total == pytest.approx(out.pipeline)
    slower = step_time(
        np.array([100.0, 50.0]),
        np.array([80.0, 80.0]),
        np.array([link]),
        np.zeros((s, r)),
        np.zeros((s, r)),
        job,
        r,
    )
    assert slower.total > out.total


@pytest.mark.parametrize(
    "shape",
    [(4, 64, 4, 256, 32), (3, 48, 2, 100, 16), (24, 1000, 10, 32000, 1024), (32, 4096, 32, 50257, 2048)],
)
def test_shape_from_a_spec_is_the_spec_arithmetic(shape: tuple[int, int, int, int, int]) -> None:
    n_layers, d, heads, vocab, seq_len = shape
    spec = ModelSpec(n_layers=n_layers, d_model=d, n_heads=heads, vocab_size=vocab, seq_len=seq_len)
    m = ModelShape.from_spec(spec)
    assert (m.layers, m.d_model, m.heads, m.vocab, m.seq_len) == shape
    assert m.params_per_layer == spec.matmul_params_per_layer == 4 * d * d + 3 * d * spec.ffn_hidden
    assert m.embed_params == spec.embed_params == vocab * d
    assert m.flops_per_token_layer == spec.layer_flops_per_token == 2 * m.params_per_layer + 4 * seq_len * d
    # The generic MLP form with the SwiGLU's width agrees (up to float rounding): one formula, two inputs.
    generic = ModelShape(n_layers, d, heads, vocab, seq_len, ffn_mult=1.5 * spec.ffn_hidden / d)
    assert generic.params_per_layer == pytest.approx(m.params_per_layer, rel=1e-12)
    assert generic.flops_per_token_layer == pytest.approx(m.flops_per_token_layer, rel=1e-12)
    # The planner's view of a job uses that shape.
    job = JobSpec.model_validate(
        {
            "name": "t",
            "model": spec.model_dump(),
            "batch": {"tokens_per_step": seq_len, "micro_batch_size": 1},
        }
    )
    assert step_job(job).model == m


def test_a_bottleneck_token_table_costs_the_stages_after_the_first_memory() -> None:
    """``model.bottleneck_tokens``: each stage after the first holds one more vocab x d table, so a
    memory-bound plan fits fewer layers there, and the real tables are that size."""
    base = {"n_layers": 8, "d_model": 512, "n_heads": 8, "vocab_size": 50_000, "seq_len": 256}
    plain = ModelSpec(**base, bottleneck_rank=64)
    side = ModelSpec(**base, bottleneck_rank=64, bottleneck_tokens=True)
    assert ModelShape.from_spec(plain).side_params == 0.0
    assert ModelShape.from_spec(side).side_params == side.embed_params
    batch = BatchSpec(sequences_per_step=8, micro_batch=1)
    memory, in_flight = np.array([0.7, 0.7, 0.7]), np.array([3.0, 2.0, 1.0])
    caps_plain = memory_caps(StepJob(ModelShape.from_spec(plain), batch), memory, in_flight)
    caps_side = memory_caps(StepJob(ModelShape.from_spec(side), batch), memory, in_flight)
    assert caps_side[0] == caps_plain[0] and (caps_side[1:] < caps_plain[1:]).all()


def test_an_overlapped_outer_sync_is_exposed_only_where_it_outlasts_the_next_pipeline() -> None:
    """DiLoCo's sync every h steps (the per-byte cost is a sync's over h): waited for, it is priced as
    a per-step all-reduce; under the next step (``overlap_sync``), only the part of a whole sync longer
    than that step's pipeline, spread over the h steps."""
    from dataclasses import replace

    from potluck.coordinator.placement.costmodel import CodecRatios

    base = _job(layers=4)
    s, r, h = 2, 2, 4

    def run(per_byte: float, overlap: bool) -> tuple[float, float, float]:
        job = replace(base, codecs=CodecRatios(sync_every=h, overlap_sync=overlap))
        out = step_time(
            np.array([100.0, 100.0]),
            np.array([80.0, 80.0]),
            np.array([0.01]),
            np.zeros((s, r)),
            np.full((s, r), per_byte),
            job,
            r,
        )
        return out.pipeline, out.dp_exposed, h * max(out.dp_sync)  # the last: one whole sync (s)

    pipeline, waited, whole = run(1e-9, overlap=False)
    assert waited > 0.0 and whole < pipeline
    assert run(1e-9, overlap=True)[1] == 0.0  # a whole sync fits under one step
    _, long_waited, long_whole = run(1e-7, overlap=False)
    _, long_hidden, _ = run(1e-7, overlap=True)
    assert long_whole > pipeline and long_hidden == pytest.approx((long_whole - pipeline) / h, rel=1e-6)
    assert long_hidden < long_waited
