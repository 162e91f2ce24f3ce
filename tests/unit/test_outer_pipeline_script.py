"""The 2 stages x 2 replicas benchmark (``scripts/_outer_pipeline.py``) counts what it claims:
fp32 data parallelism's bytes by the formula, the coded run's by its payloads, replicas identical."""

from __future__ import annotations

import sys
from pathlib import Path

from potluck.protocol.jobspec import CompressionSpec, OptimizerSpec

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_2x2_run_counts_bytes_per_link_and_keeps_replicas_identical(monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import _outer_pipeline as bench
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    monkeypatch.setitem(bench.PIPE_MODELS, "t", (2, 32, 2, 4, 16))  # 2 layers, d=32, 4 x 16 tokens/step
    monkeypatch.setattr(bench, "EVAL_SEQUENCES", 4)
    monkeypatch.setattr(bench, "CORPUS_CHARS", 20_000)
    opt = OptimizerSpec(lr=3e-3, warmup_steps=1)
    base = bench.run_pipeline("t", 0, 4, opt, None)
    comp = CompressionSpec(activations="int8:block=32", sync_every=2, outer="int2:block=32|zstd")
    coded = bench.run_pipeline("t", 0, 4, opt, comp)
    tokens_per_step = 4 * 16
    assert base["sync_bytes_per_token"] == 4 * base["params"] * bench.REPLICAS / tokens_per_step
    assert base["act_fwd_bytes_per_token"] == base["act_bwd_bytes_per_token"] == 4 * 32
    assert coded["syncs"] == 2 and coded["replicas_identical"]
    # 2-bit codes every 2 steps: over 16x fewer bytes than fp32 every step (scales and headers included)
    assert coded["sync_bytes_per_token"] < base["sync_bytes_per_token"] / 16
    assert coded["act_fwd_bytes_per_token"] < base["act_fwd_bytes_per_token"] / 3  # int8 + a scale per 32
    assert coded["loss"] > 0 and base["loss"] > 0
    # the whole job: a rank-4 bottleneck before the int8 codec sends 4 of 32 numbers a token
    ranked = bench.run_pipeline("t", 0, 4, opt, comp, rank=4)
    assert ranked["act_fwd_bytes_per_token"] < coded["act_fwd_bytes_per_token"] / 4  # 8x fewer, headers aside
    assert ranked["params"] == coded["params"] + 2 * 4 * 32 and ranked["replicas_identical"]
