"""The job's optimizer: AdamW with a linear warm-up and cosine decay, clipped by the global norm.

The learning rate is a pure function of the step, so a resumed or replaced peer computes the same rate
as everyone else from the agreed step alone. Clipping uses the norm of the WHOLE model's gradient, which
no single stage sees: each stage contributes its squared norm to the step commit (see ``commit.py``)
and gets the global norm back before it steps.
"""

from __future__ import annotations

import math

import torch

from potluck.protocol.jobspec import OptimizerSpec


def learning_rate(spec: OptimizerSpec, step: int, total_steps: int) -> float:
    """lr at ``step`` (0-based): linear warm-up over ``warmup_steps``, then cosine to ``min_lr_ratio``."""
    if spec.warmup_steps and step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    decay_steps = max(1, total_steps - spec.warmup_steps)
    progress = min(1.0, (step - spec.warmup_steps) / decay_steps)
    floor = spec.lr * spec.min_lr_ratio
    return floor + (spec.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(params: list[torch.nn.Parameter], spec: OptimizerSpec) -> torch.optim.AdamW:
    """AdamW; norms and gains (1-D parameters) are not decayed, matrices and embeddings are."""
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": spec.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # foreach=False: the per-tensor loop gives bit-identical updates on every replica and in the
    # single-process reference regardless of how parameters are grouped into stages.
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=spec.lr,
        betas=(spec.beta1, spec.beta2),
        eps=spec.eps,
        foreach=False,
    )


def clip_coefficient(spec: OptimizerSpec, global_norm: float) -> float:
    """Factor gradients are multiplied by so that their global norm is at most ``clip_norm``."""
    if spec.clip_norm <= 0 or not math.isfinite(global_norm) or global_norm <= spec.clip_norm:
        return 1.0
    return spec.clip_norm / (global_norm + 1e-6)
