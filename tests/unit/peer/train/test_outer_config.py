"""``compression.outer_lr`` / ``outer_momentum`` reach DiLoCo's outer SGD, coded sync or not
(``peer/train/outer.py``)."""

from __future__ import annotations

import asyncio

import torch

from potluck.peer.train.outer import make_diloco, outer_config
from potluck.protocol.jobspec import CompressionSpec


def test_outer_config_takes_the_jobs_outer_step():
    cfg = outer_config(CompressionSpec(sync_every=8, outer_lr=0.4, outer_momentum=0.8))
    assert (cfg.inner_steps, cfg.outer_lr, cfg.outer_momentum) == (8, 0.4, 0.8)
    default = outer_config(CompressionSpec(sync_every=8))
    assert (default.outer_lr, default.outer_momentum) == (0.7, 0.9)  # DiLoCo's


def test_a_decaying_residual_still_turns_the_momentum_off():
    cfg = outer_config(CompressionSpec(sync_every=8, outer="int2", outer_ef_decay=0.9, outer_lr=1.2))
    assert (cfg.outer_lr, cfg.outer_momentum) == (1.2, 0.0)


def test_the_outer_sgd_runs_with_them_coded_or_not():
    for outer in (None, "int2:block=32|zstd"):
        comp = CompressionSpec(sync_every=4, outer=outer, outer_lr=1.0, outer_momentum=0.5)
        d = make_diloco([torch.nn.Parameter(torch.zeros(8))], comp)
        group = d.outer.param_groups[0]
        assert (group["lr"], group["momentum"], group["nesterov"]) == (1.0, 0.5, True)
    plain = make_diloco(
        [torch.nn.Parameter(torch.zeros(8))], CompressionSpec(sync_every=4, outer_momentum=0.0)
    )
    assert (
        plain.outer.param_groups[0]["nesterov"] is False
    )  # plain SGD: torch refuses Nesterov without momentum


def test_a_diloco_started_between_syncs_syncs_at_the_next_multiple_of_h():
    """Pauses, hand-offs and checkpoints sit at multiples of H, so a plan that starts at step 6 with
    H = 4 syncs at step 8 (after 2 inner steps), then every 4."""

    async def steps(n: int, d) -> list[bool]:
        async def mean(t: torch.Tensor) -> torch.Tensor:
            return t

        return [await d.after_inner_step(mean) for _ in range(n)]

    comp = CompressionSpec(sync_every=4)
    d = make_diloco([torch.nn.Parameter(torch.zeros(8))], comp, step=6)
    assert asyncio.run(steps(6, d)) == [False, True, False, False, False, True]  # steps 7..12
    fresh = make_diloco([torch.nn.Parameter(torch.zeros(8))], comp)
    assert asyncio.run(steps(4, fresh)) == [False, False, False, True]
