"""A job with ``model.bottleneck_rank``: the swarm equals the reference cut at the same place, the cut
carries rank-wide codes, a resume from a checkpoint continues the loss curve (the maps are saved), and
so does one under a plan that cuts elsewhere (the positions stay; the learned maps move)."""

import asyncio
import shutil

import pytest
import torch

from potluck.model.reference import parameters_by_global_name, reference_run
from potluck.testbed.harness.training import tiny_dataset, tiny_job, train_swarm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SPLITS = [(0, 2), (2, 4)]


@pytest.mark.parametrize("side", [False, True], ids=["maps", "token-side-path"])
def test_bottleneck_2x2_equals_the_reference_cut_at_the_same_layer(tmp_path, side):
    """With ``bottleneck_tokens`` the stage after the cut reads the ids from its own copy of the data
    (no extra bytes: the ratio below is the same) and its token table trains like any weight."""
    job = tiny_job(steps=8, model={"bottleneck_rank": 4, "bottleneck_tokens": side})
    reports, trainers = asyncio.run(train_swarm(job, 2, 2, SPLITS, tmp_path))
    swarm_losses = [r.loss for r in reports[(1, 0)]]
    ref_losses, ref = reference_run(job, tiny_dataset(job), n_replicas=2, cuts=(2,))
    assert swarm_losses == pytest.approx(ref_losses, rel=1e-4, abs=1e-5)
    uncut, _ = reference_run(job, tiny_dataset(job), n_replicas=2)  # no cut: no bottleneck
    assert uncut != pytest.approx(ref_losses, rel=1e-4, abs=1e-5)
    want = parameters_by_global_name(ref)
    assert "boundaries.2.down.weight" in want and "boundaries.2.up.weight" in want
    assert ("boundaries.2.tokens.weight" in want) == side
    for (stage, replica), tr in trainers.items():
        for name, tensor in parameters_by_global_name(tr.runner).items():
            torch.testing.assert_close(
                tensor, want[name], rtol=1e-3, atol=2e-5, msg=f"{stage}/{replica} {name}"
            )
    # 4 of 32 numbers per token cross the cut, fp32 ("none" codec): 8x, headers aside
    assert 7.0 < reports[(0, 0)][-1].activation_ratio <= 8.0


def test_bottleneck_resume_continues_the_loss_curve_also_cut_elsewhere(tmp_path):
    """Epoch 1 cuts at 2 (the bottleneck's position) and stops at step 6. Resumed with the same cut, the
    loss curve and the maps are the uninterrupted run's. Resumed cut at 3 with the position kept
    (``TrainPlan.bottlenecks``): stage [0, 3) applies U D at 2 in place, the new cut carries full-width
    states, and the curve is still the uninterrupted run's. Without the kept position (the plan's own
    cut, as before) the maps restart at the identity and the curve departs."""
    job = tiny_job(steps=12, model={"bottleneck_rank": 4}, checkpoint={"interval": 6})
    full, whole = asyncio.run(train_swarm(job, 2, 2, SPLITS, tmp_path / "full"))
    want = [r.loss for r in full[(1, 0)][6:]]
    root = tmp_path / "resumed"
    first, _ = asyncio.run(train_swarm(job, 2, 2, SPLITS, root, stop_after=6))
    assert first[(0, 0)][-1].checkpoint is not None
    for copy in ("kept", "moved"):
        shutil.copytree(root, tmp_path / copy)
    rest, trainers = asyncio.run(train_swarm(job, 2, 2, SPLITS, root, start_step=6, epoch=2))
    assert [r.loss for r in rest[(1, 0)]] == pytest.approx(want, rel=1e-4, abs=1e-5)
    for key, tr in trainers.items():  # the maps came back from the checkpoint and went on training
        got, expect = parameters_by_global_name(tr.runner), parameters_by_global_name(whole[key].runner)
        for name in [n for n in expect if n.startswith("boundaries.")]:
            torch.testing.assert_close(got[name], expect[name], rtol=1e-3, atol=2e-5, msg=f"{key} {name}")

    recut = [(0, 3), (3, 4)]
    kept, trainers = asyncio.run(
        train_swarm(job, 2, 2, recut, tmp_path / "kept", start_step=6, epoch=2, bottlenecks=[2])
    )
    assert [r.loss for r in kept[(1, 0)]] == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert trainers[(0, 0)].runner.model.cuts == (2,) and not trainers[(1, 0)].runner.model.boundaries
    assert 0.9 < kept[(0, 0)][-1].activation_ratio <= 1.0  # the new cut sends all 32 numbers a token
    moved, _ = asyncio.run(train_swarm(job, 2, 2, recut, tmp_path / "moved", start_step=6, epoch=2))
    assert [r.loss for r in moved[(1, 0)]] != pytest.approx(want, rel=1e-4, abs=1e-5)
