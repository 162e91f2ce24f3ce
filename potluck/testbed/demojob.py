"""The demo's embedded job: a 4-layer byte-level model on the built-in arithmetic corpus, forced to 2
pipeline stages x 2 data-parallel replicas so every mechanism runs. ``potluck demo`` trains it; the
benchmarks that compare against it (the training and telemetry benchmarks, the hivemind baseline in
``testbed/baseline/``) build the same job from here.
"""

from __future__ import annotations

from pathlib import Path

from potluck.protocol.jobspec import JobSpec, parse_job

STAGES, REPLICAS = 2, 2


def demo_job(steps: int, checkpoint_dir: Path) -> JobSpec:
    """The embedded job: small enough for 2 CPU cores, big enough to learn the corpus visibly."""
    return parse_job(
        {
            "name": "demo",
            "seed": 0,
            "steps": steps,
            "min_peers": STAGES * REPLICAS,
            "model": {"n_layers": 4, "d_model": 128, "n_heads": 4, "vocab_size": 256, "seq_len": 64},
            "batch": {"tokens_per_step": 64 * 32, "micro_batch_size": 4},
            "data": {"source": "generated", "generated_chars": 400_000},
            "optimizer": {"lr": 3e-3, "warmup_steps": 10, "min_lr_ratio": 0.1},
            "checkpoint": {"dir": str(checkpoint_dir), "interval": max(10, steps // 4), "keep": 2},
            "limits": {"stages": STAGES, "replicas": REPLICAS},
        },
        source="demo job",
    )
