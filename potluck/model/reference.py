"""The single-process reference: the same job on one machine, for checking the swarm against.

One ``StageRunner`` holds every layer; each step runs every replica's micro-batches in turn with the
same loss weights, clips by the same global norm and steps AdamW at the same learning rate. A swarm
without lossy codecs must reproduce its per-step losses and final weights up to float summation order
(tested on loopback); ``potluck demo --verify`` and the benchmarks use it too.
"""

from __future__ import annotations

import torch

from potluck.model.data import TokenDataset
from potluck.model.optim import clip_coefficient, learning_rate
from potluck.model.stage import StageRunner
from potluck.protocol.jobspec import JobSpec


def reference_run(
    job: JobSpec,
    dataset: TokenDataset,
    n_replicas: int,
    steps: int | None = None,
    start: int = 0,
    runner: StageRunner | None = None,
    cuts: tuple[int, ...] = (),
) -> tuple[list[float], StageRunner]:
    """Per-step losses of steps [start, start + steps) and the runner holding the final weights.
    ``cuts``: where the swarm's pipeline is cut (the plan's stage starts after the first), which is
    where a job with ``model.bottleneck_rank`` has its bottlenecks; nothing changes without one."""
    runner = runner or StageRunner(job.model, 0, job.model.n_layers, job.seed, job.optimizer, cuts=cuts)
    per_step = job.sequences_per_step
    losses = []
    for step in range(start, start + (job.steps - start if steps is None else steps)):
        loss, m = 0.0, 0
        for replica in range(n_replicas):
            batch = dataset.replica_batch(step, replica, n_replicas, per_step)
            for inputs, targets in dataset.micro_batches(batch, job.batch.micro_batch_size):
                share = inputs.shape[0] / per_step
                loss += float(runner.forward(m, inputs, targets, share)) * share
                runner.backward(m)
                m += 1
        coef = clip_coefficient(job.optimizer, runner.grad_sq_norm() ** 0.5)
        runner.step(learning_rate(job.optimizer, step, job.steps), coef)
        losses.append(loss)
    return losses, runner


def parameters_by_global_name(runner: StageRunner) -> dict[str, torch.Tensor]:
    """A stage's weights named by global layer index, so stages can be compared with the reference
    (bottleneck maps are named by their global cut already)."""
    out = {}
    for name, tensor in runner.model.state_dict().items():
        parts = name.split(".")
        if parts[0] == "layers":
            parts[1] = str(runner.first + int(parts[1]))
        out[".".join(parts)] = tensor
    return out
