"""Pipeline spot checks without a network: the draw of checks, evidence framing, and replays
that reproduce a stage's micro-batch bit for bit while catching a corrupted one."""

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from potluck.compression import get_codec
from potluck.model.stage import StageRunner
from potluck.net.tags import Round
from potluck.peer.train.checks.evidence import (
    MAX_CHECKERS,
    check_seed,
    mismatch,
    pack_evidence,
    unpack_evidence,
)
from potluck.peer.train.checks.spot import select_checks
from potluck.peer.train.commit import Decision
from potluck.testbed.harness.training import tiny_job


def test_checks_are_drawn_alike_by_everyone_and_at_the_asked_rate():
    seed = check_seed("job", Round(1, 5), Decision(True, (1.5, 1.5), 3.25))
    assert seed == check_seed("job", Round(1, 5), Decision(True, (1.5, 1.5), 3.25))
    assert seed != check_seed("job", Round(1, 5), Decision(True, (1.5, 1.5), 3.2500001))
    checks = select_checks(seed, [0, 1, 2], 6, 8, 0.3)
    assert checks == select_checks(seed, [2, 1, 0, 1], 6, 8, 0.3)
    for c in checks:
        assert c.suspect not in c.checkers and len(set(c.checkers)) == len(c.checkers) == MAX_CHECKERS
    drawn = sum(len(select_checks(bytes([s]) * 32, [0], 10, 10, 0.05)) for s in range(200))
    assert 0.04 < drawn / (200 * 100) < 0.06
    assert select_checks(seed, [0], 6, 8, 0.0) == [] and select_checks(seed, [0], 1, 8, 1.0) == []
    assert all(c.checkers == (0,) for c in select_checks(seed, [0], 2, 4, 1.0) if c.suspect == 1)


def test_evidence_framing_refuses_anything_but_its_exact_shape():
    blobs = [b"abc", b""]
    assert unpack_evidence(pack_evidence(blobs), 2) == blobs
    data = pack_evidence(blobs)
    for bad, count in [(data[:-1], 2), (data + b"x", 2), (data, 3), (b"", 2), (data[:3], 2)]:
        with pytest.raises(ValueError):
            unpack_evidence(bad, count)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 4))
def test_evidence_framing_fuzzed(data, count):
    try:
        out = unpack_evidence(data, count)
    except ValueError:
        return
    assert len(out) == count and sum(map(len, out)) <= len(data)


JOB = tiny_job()


def runners(splits):
    return [StageRunner(JOB.model, a, b, JOB.seed, JOB.optimizer) for a, b in splits]


def test_replay_reproduces_every_stage_bit_for_bit():
    first, middle, last = runners([(0, 1), (1, 3), (3, 4)])
    tokens = torch.randint(0, 256, (2, 16))
    targets = torch.randint(0, 256, (2, 16))
    g_out = torch.randn(2, 16, 32)
    y0 = first.forward(0, tokens)
    y1 = middle.forward(0, y0)
    last.forward(0, y1, targets, 0.25)
    g1 = last.backward(0)
    g0 = middle.backward(0, g_out)
    assert torch.equal(first.replay(first.frozen_copy(), tokens)[0], y0)
    # a GPU stage's copy goes to the CPU, built without initialising it twice: the same bits here
    assert torch.equal(first.replay(first.frozen_copy(on_cpu=True), tokens)[0], y0)
    y1c, g0c = middle.replay(middle.frozen_copy(on_cpu=True), y0, grad_output=g_out)
    assert torch.equal(y1c, y1) and torch.equal(g0c, g0)
    y1r, g0r = middle.replay(middle.frozen_copy(), y0, grad_output=g_out)
    assert torch.equal(y1r, y1) and torch.equal(g0r, g0)
    nothing_sent, g1r = last.replay(last.frozen_copy(), y1, targets, 0.25)
    assert nothing_sent is None and torch.equal(g1r, g1)
    # the copy stays put while the live stage trains on
    frozen = first.frozen_copy()
    first.forward(1, tokens)
    first.backward(1, torch.ones(2, 16, 32))
    first.step(0.1)
    assert torch.equal(first.replay(frozen, tokens)[0], y0)
    assert not torch.equal(first.replay(first.frozen_copy(), tokens)[0], y0)


@pytest.mark.parametrize("spec", ["none", "int8:block=64"])
def test_mismatch_allows_the_codec_and_catches_tampering(spec):
    codec = get_codec(spec)
    y = torch.randn(2, 16, 32)
    honest = codec.decode(codec.encode(y))
    assert mismatch(honest, y, codec, 0.05) is None
    for tampered in (1.1 * honest, -honest, honest + 0.2 * torch.randn_like(y), torch.zeros_like(y)):
        err = mismatch(tampered, y, codec, 0.05)
        assert err is not None and err > 0.05
    assert mismatch(honest[:1], y, codec, 0.05) == float("inf")
