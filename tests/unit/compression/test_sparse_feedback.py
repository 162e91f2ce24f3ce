from __future__ import annotations

import pytest
import torch

from potluck.compression import EncodeError, ErrorFeedback, decode, get_codec
from potluck.compression.stages.base import StageCtx
from potluck.compression.stages.sparsify import RandKStage


def _heavy(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.distributions.StudentT(2.0).sample((n,)) if seed < 0 else torch.randn(n, generator=g) ** 3


def test_randk_sends_zero_index_bytes_and_positions_follow_the_key() -> None:
    n = 10000
    x = _heavy(n)
    sparse = get_codec("randk:density=0.01|none")
    data = sparse.encode(x, key=(5, 1, 0))
    k = RandKStage("randk", {"density": "0.01"}).expected_k(n)
    dense_empty = get_codec("none").encode(torch.empty(0), key=1)
    # payload = header + k raw values and nothing else: no index section
    assert len(data) - len(dense_empty) == 4 * k + len(sparse.spec) - len("none")
    y = decode(data)
    assert int((y != 0).sum()) == k
    same = decode(sparse.encode(x, key=(5, 1, 0)))
    other = decode(sparse.encode(x, key=(6, 1, 0)))
    assert torch.equal(y, same) and not torch.equal(y != 0, other != 0)


def test_randk_positions_are_one_per_stratum() -> None:
    st = RandKStage("randk", {"density": "0.1"})
    pos = st.compute_positions(1005, StageCtx(torch.float32, (1005,), 77))
    assert pos.numel() == 101
    assert torch.equal(pos // 10, torch.arange(101))
    assert int(pos[-1]) < 1005


def test_randk_needs_a_key() -> None:
    with pytest.raises(EncodeError, match="key"):
        get_codec("randk|int8").encode(torch.randn(100))


def test_randk_unbiased_estimate() -> None:
    x = torch.randn(1000)
    c = get_codec("randk:density=0.25,unbiased=1|none")
    mean = torch.stack([decode(c.encode(x, key=r)) for r in range(400)]).mean(0)
    assert float((mean - x).norm() / x.norm()) < 0.2


@pytest.mark.parametrize("method", ["sample", "chunk"])
def test_topk_density_and_keeps_the_largest(method: str) -> None:
    x = _heavy(200_000, 1)
    y = decode(get_codec(f"topk:density=0.01,method={method},chunk=200").encode(x))
    kept = int((y != 0).sum())
    assert 0.9 * 2000 <= kept <= 1.1 * 2000
    assert torch.equal(y[y != 0], x[y != 0])  # raw values survive exactly
    if method == "sample":  # global threshold: nothing dropped is larger than what was kept
        assert float(x[y == 0].abs().max()) <= float(x[y != 0].abs().min()) * 1.0001


def test_topk_index_gaps_are_compact_and_bitmask_used_when_dense() -> None:
    n = 100_000
    x = _heavy(n, 2)
    sparse = get_codec("topk:density=0.01|int8").encode(x)
    assert len(sparse) < 1000 * (1 + 1 + 2) + 2000  # <= 2 bytes per index before zstd
    dense = get_codec("topk:density=0.5|int8").encode(x)
    assert len(dense) < n * 0.5 + n / 8 + 4000  # bitmask: n/8 bytes
    assert torch.equal(decode(dense) != 0, (decode(dense) != 0))


@pytest.mark.parametrize(
    "spec",
    ["int8", "int2:block=32", "topk:density=0.05|int4", "randk:density=0.1|int8", "powersgd:rank=1|bf16"],
)
def test_error_feedback_residual_is_exactly_what_was_lost(spec: str) -> None:
    g = torch.randn(3000)
    c = get_codec(spec)
    ef = ErrorFeedback()
    sent = torch.zeros(3000)
    for rnd in range(4):  # 4 rounds: the dense path double-buffers the residual, so buffers swap
        sent += c.decode(c.encode(g, key=rnd, state=ef))
        assert ef.residual is not None
        torch.testing.assert_close(ef.residual, (rnd + 1) * g - sent, atol=1e-5, rtol=0)


def test_error_feedback_makes_the_running_sum_converge() -> None:
    g = torch.randn(2000)
    c = get_codec("topk:density=0.02|int2")
    ef = ErrorFeedback()
    total = torch.zeros(2000)
    steps = 200
    for r in range(steps):
        c.decode_into(c.encode(g, key=r, state=ef), total)
    # without EF, 2% top-k forever misses 98% of the coordinates; with EF the mean converges
    assert float((total / steps - g).norm() / g.norm()) < 0.2


def test_error_feedback_state_mismatch_is_an_error() -> None:
    ef = ErrorFeedback()
    get_codec("int8").encode(torch.randn(10), state=ef)
    with pytest.raises(EncodeError):
        get_codec("int8").encode(torch.randn(11), state=ef)


def test_zstd_shrinks_int4_gradients_and_never_grows_noise() -> None:
    g = _heavy(1 << 16, 3)
    plain = len(get_codec("int4").encode(g))
    packed = len(get_codec("int4|zstd").encode(g))
    assert packed < plain / 1.1
    noise = torch.rand(1 << 14)
    assert len(get_codec("none|zstd").encode(noise)) <= len(get_codec("none").encode(noise)) + 8
