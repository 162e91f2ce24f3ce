"""The peer's two waves (issue 19): the first wave ends a step with the sum of both waves' gradients,
the second follows the first's weights, and a pair that does not fit the budget runs in turn."""

from __future__ import annotations

import pytest
import torch

from potluck.model.data import ByteTokenizer, TokenDataset, generated_corpus
from potluck.model.stage import StageRunner
from potluck.peer.probe import pair_speedup
from potluck.peer.train.pipeline import MicroBatch
from potluck.peer.train.waves import Waves
from potluck.protocol.jobspec import ModelSpec, OptimizerSpec

SPEC = ModelSpec(n_layers=3, d_model=32, n_heads=2, vocab_size=256, seq_len=16)
PER_STEP = 8  # sequences a step, over two shards of 4


def runner(first: int = 0, last: int = 3) -> StageRunner:
    return StageRunner(SPEC, first, last, 5, OptimizerSpec(lr=1e-2, warmup_steps=0))


def shards(step: int = 0) -> list[list[MicroBatch]]:
    data = TokenDataset(ByteTokenizer().encode(generated_corpus(5000, 1)), SPEC.seq_len)
    out = []
    for shard in range(2):
        batch = data.replica_batch(step, shard, 2, PER_STEP)
        out.append(
            [
                MicroBatch(x, y, weight=x.shape[0] / PER_STEP, share=x.shape[0] / PER_STEP)
                for x, y in data.micro_batches(batch, 2)
            ]
        )
    return out


def test_the_first_wave_holds_the_sum_of_both_waves_gradients():
    first = runner()
    waves = Waves(first, max_memory_bytes=None)
    waves.prepare(shards()[0][0])
    assert waves.tick is not None and waves.refused is None
    loss, seconds = waves.run(shards())
    assert seconds > 0 and all(p.grad is None for p in waves.second.params)

    alone = runner()  # one runner over both shards' micro-batches: what two peers' SUM gives
    want, m = 0.0, 0
    for ms in shards():
        for mb in ms:
            want += float(alone.forward(m, mb.inputs, mb.targets, mb.weight)) * mb.share
            alone.backward(m)
            m += 1
    assert loss == pytest.approx(want, rel=1e-6)
    for a, b in zip(first.params, alone.params, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)


def test_the_second_wave_follows_the_first_after_an_update():
    first = runner()
    waves = Waves(first, max_memory_bytes=None)
    waves.run(shards())
    first.step(1e-2)
    assert any(not torch.equal(a, b) for a, b in zip(first.params, waves.second.params, strict=True))
    waves.follow()
    assert all(torch.equal(a, b) for a, b in zip(first.params, waves.second.params, strict=True))


def test_a_budget_without_room_for_the_pair_runs_the_waves_in_turn_with_the_same_gradients():
    tight = Waves(runner(), max_memory_bytes=1)
    tight.prepare(shards()[0][0])
    assert tight.tick is None and tight.refused is not None and "budget" in tight.refused
    free = Waves(runner(), max_memory_bytes=None)
    free.prepare(shards()[0][0])
    a, _ = tight.run(shards())
    b, _ = free.run(shards())
    assert a == pytest.approx(b, rel=1e-6)
    for x, y in zip(tight.first.params, free.first.params, strict=True):
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-5, atol=1e-7)


def test_waves_need_a_whole_model_stage():
    with pytest.raises(ValueError, match="whole-model"):
        Waves(runner(0, 2), max_memory_bytes=None)


def test_the_pair_probe_reports_a_speedup_within_its_bounds():
    s = pair_speedup(torch.device("cpu"), budget_s=0.02, size=64)
    assert 0.0 < s <= 2.0
