"""Tick-tock in a swarm (issue 19): a peer running two replicas' shares as two waves on its one device
trains the same model as separate peers would (the single-process reference, and a swarm of three)."""

import asyncio

import pytest
import torch

from potluck.model.reference import parameters_by_global_name, reference_run
from potluck.peer.config import TrainerConfig
from potluck.testbed.harness.training import tiny_dataset, tiny_job, train_swarm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WHOLE = [(0, 4)]


def test_two_waves_on_one_peer_equal_three_separate_peers(tmp_path):
    job = tiny_job(steps=8)
    # two peers: the first runs shards 0 and 1 as two waves, the second shard 2
    reports, trainers = asyncio.run(train_swarm(job, 1, 2, WHOLE, tmp_path / "waves", waves=[2, 1]))
    waves_losses = [r.loss for r in reports[(0, 0)]]
    assert len(waves_losses) == job.steps
    assert [r.loss for r in reports[(0, 1)]] == waves_losses  # both learned the committed loss
    two = trainers[(0, 0)]
    assert two.waves is not None and two.waves.tick is not None  # admitted: no budget was set
    assert list(two.shards) == [0, 1] and list(trainers[(0, 1)].shards) == [2]

    separate, _ = asyncio.run(train_swarm(job, 1, 3, WHOLE, tmp_path / "three"))
    three_losses = [r.loss for r in separate[(0, 0)]]
    assert waves_losses == pytest.approx(three_losses, rel=1e-5, abs=1e-6)

    ref_losses, ref = reference_run(job, tiny_dataset(job), n_replicas=3)
    assert waves_losses == pytest.approx(ref_losses, rel=1e-4, abs=1e-5)
    assert waves_losses[-1] < waves_losses[0]  # it learns
    want = parameters_by_global_name(ref)
    for key, tr in trainers.items():
        runners = [tr.runner] + ([tr.waves.second] if tr.waves is not None else [])
        for runner in runners:  # the second wave holds the first's weights after every step
            for name, tensor in parameters_by_global_name(runner).items():
                torch.testing.assert_close(tensor, want[name], rtol=1e-3, atol=2e-5, msg=f"{key} {name}")


def test_a_budget_below_the_staggered_peak_runs_the_waves_in_turn(tmp_path):
    job = tiny_job(steps=3)
    # weights, gradients and moments of both waves take almost all of it: no room for two peaks
    tiny = TrainerConfig(step_timeout_s=60, max_memory_bytes=1)
    reports, trainers = asyncio.run(train_swarm(job, 1, 2, WHOLE, tmp_path / "tight", cfg=tiny, waves=[2, 1]))
    two = trainers[(0, 0)].waves
    assert two is not None and two.tick is None and two.refused is not None
    assert "over the budget" in two.refused
    ref_losses, _ = reference_run(job, tiny_dataset(job), n_replicas=3)
    assert [r.loss for r in reports[(0, 0)]] == pytest.approx(ref_losses, rel=1e-4, abs=1e-5)
