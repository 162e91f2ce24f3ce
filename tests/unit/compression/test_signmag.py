"""The ``signmag`` value stage: 2-bit sign and magnitude-class codes with two magnitudes per block."""

import numpy as np
import pytest
import torch

from potluck.compression import DecodeError, ErrorFeedback, SpecError, get_codec
from potluck.compression.wire import Header, Section, pack

SPARSE = "topk:density=0.05,method=chunk|signmag|zstd"


@pytest.mark.parametrize("n", [0, 1, 5, 64, 100, 1000])
def test_every_value_keeps_its_sign_on_one_of_its_blocks_two_magnitudes(n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    codec = get_codec("signmag:block=16")
    y = codec.decode(codec.encode(x))
    assert y.shape == x.shape and y.dtype == x.dtype
    assert torch.equal(torch.sign(y[x != 0]), torch.sign(x[x != 0]))
    for b in range(0, n, 16):
        mags = torch.unique(y[b : b + 16].abs())
        assert mags.numel() <= 2
        big = x[b : b + 16].abs() > x[b : b + 16].abs().mean()
        if big.any() and (~big).any():  # the larger class decodes to the larger magnitude
            assert float(y[b : b + 16][big].abs().min()) >= float(y[b : b + 16][~big].abs().max())
    if n:
        assert codec.estimate_bytes(x.shape) == len(codec.encode(x))


def test_error_feedback_keeps_exactly_what_was_not_sent():
    codec = get_codec(SPARSE)
    x = torch.distributions.StudentT(3.0).sample((3000,))
    ef = ErrorFeedback()
    sent = codec.decode(codec.encode(x, state=ef))
    assert torch.allclose(sent + ef.residual, x, atol=1e-6)
    nz = int((sent != 0).sum())
    assert 0.04 * 3000 <= nz <= 0.06 * 3000  # unlike int2, the kept values are not rounded to zero
    sent2 = codec.decode(codec.encode(torch.zeros(3000), state=ef))
    assert float((ef.residual + sent2 - (x - sent)).abs().max()) < 1e-5


def test_it_beats_int2_on_kept_values_at_similar_size():
    x = torch.distributions.StudentT(3.0).sample((50000,))
    errs = {}
    for spec in ("topk:density=0.05,method=chunk|signmag|zstd", "topk:density=0.05,method=chunk|int2|zstd"):
        c = get_codec(spec)
        errs[spec] = float((c.decode(c.encode(x)) - x).norm() / x.norm())
    assert (
        errs["topk:density=0.05,method=chunk|signmag|zstd"] < errs["topk:density=0.05,method=chunk|int2|zstd"]
    )


def _payload(scales, codes, n=8, spec="signmag:block=8"):
    sections = [
        Section(np.asarray(scales, dtype=np.int16).view(np.uint8).copy(), 2),
        Section(np.asarray(codes, dtype=np.uint8), 1),
    ]
    return pack(Header(torch.float32, (n,), spec, None, 0), sections)


def test_hostile_payloads_are_refused():
    codec = get_codec("signmag:block=8")
    ok = _payload([0x3F80, 0x4000], [0b11100100, 0])  # lo = 1, hi = 2
    y = codec.decode(ok, expect=(8,)).tolist()  # planar: byte 0 holds elements 0, 2, 4, 6
    assert (y[0], y[2], y[4], y[6], y[1]) == (1.0, -1.0, 2.0, -2.0, 1.0)
    for scales in ([0x7FC0, 0x4000], [0x3F80, 0x7F80], [-16512, 0x4000]):  # NaN, +Inf, -1.0
        with pytest.raises(DecodeError, match="finite and non-negative"):
            codec.decode(_payload(scales, [0, 0]), expect=(8,))
    with pytest.raises(DecodeError, match="codes"):
        codec.decode(_payload([0x3F80, 0x4000], [0]), expect=(8,))
    with pytest.raises(DecodeError, match="codec"):
        get_codec("signmag").decode(ok, expect=(8,))  # block 8 payload on a block-64 link


def test_spec_checks():
    with pytest.raises(SpecError):
        get_codec("signmag:block=6")
    with pytest.raises(SpecError):
        get_codec("signmag|topk")  # order: select before value
    assert get_codec("topk|signmag:block=64").spec == "topk|signmag"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_gpu_encode_gives_the_cpu_bytes():
    x = torch.distributions.StudentT(3.0).sample((100_000,))
    for spec in ("signmag", SPARSE):
        c = get_codec(spec)
        assert c.encode(x.cuda(), key=(1, 2)) == c.encode(x, key=(1, 2))
