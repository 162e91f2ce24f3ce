"""The job files the swarm tests and benchmarks launch: one small recipe, the knobs they differ in."""

from __future__ import annotations

from pathlib import Path


def job_toml(
    name: str,
    *,
    steps: int,
    ckpt: Path,
    interval: int,
    seed: int = 0,
    n_layers: int = 4,
    d_model: int = 64,
    min_peers: int = 2,
    **limits: int,
) -> str:
    """A TOML job: a byte-level model of ``n_layers`` x ``d_model`` on 20k generated characters,
    128 tokens a step in micro-batches of 2; ``limits`` fill the [limits] table (stages=2, ...)."""
    lines = [
        f'name = "{name}"',
        f"seed = {seed}",
        f"steps = {steps}",
        f"min_peers = {min_peers}",
        "[model]",
        f"n_layers = {n_layers}",
        f"d_model = {d_model}",
        "n_heads = 4",
        "vocab_size = 256",
        "seq_len = 16",
        "[batch]",
        "tokens_per_step = 128",
        "micro_batch_size = 2",
        "[data]",
        "generated_chars = 20000",
        "[checkpoint]",
        f'dir = "{ckpt}"',
        f"interval = {interval}",
        "[limits]",
        *(f"{key} = {value}" for key, value in limits.items()),
    ]
    return "\n".join(lines) + "\n"
