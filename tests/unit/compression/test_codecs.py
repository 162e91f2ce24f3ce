from __future__ import annotations

import struct
import zlib

import pytest
import torch

from potluck.compression import (
    DecodeError,
    EncodeError,
    NonFiniteError,
    SpecError,
    decode,
    get_codec,
)
from potluck.compression.wire import FIXED_SIZE, seal

SPECS = [
    "none",
    "fp32",
    "fp16",
    "bf16",
    "int8:block=64",
    "int4:block=32",
    "int2:block=128",
    "int4:block=64,rounding=stochastic",
    "topk:density=0.05|int4:block=64|zstd",
    "topk:density=0.2,method=chunk,chunk=64|bf16",
    "randk:density=0.1|int8",
    "randk:density=0.25,unbiased=1|fp16|zstd",
    "powersgd:rank=2|fp16",
    "int8|zstd",
    "none|zstd",
]
# worst-case relative L2 error per spec on Gaussian data (loose: these catch gross breakage)
BOUND = {"int8:block=64": 0.01, "int4:block=32": 0.15, "int2:block=128": 0.9, "fp16": 1e-3, "bf16": 5e-3}
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def _x(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_shape_dtype_and_all_decoders_agree(spec: str, dtype: torch.dtype) -> None:
    codec = get_codec(spec)
    x = _x((33, 17), dtype)
    data = codec.encode(x, key=(3, 1, 0))
    y = codec.decode(data)
    assert y.shape == x.shape and y.dtype == dtype
    assert torch.equal(y, decode(data))  # self-describing: no codec needed
    acc = torch.ones(33, 17)
    codec.decode_into(data, acc)  # accumulates the fp32 values, before rounding to the payload dtype
    exact = dtype in (torch.float32, torch.float64) or spec.startswith("none")
    tol = {} if exact else {"rtol": 1e-2, "atol": 1e-2}
    torch.testing.assert_close(acc, 1 + y.float(), **tol)
    codec.decode_into(data, acc, accumulate=False)
    torch.testing.assert_close(acc, y.float(), **tol)
    if spec in BOUND:
        assert float((y.double() - x.double()).norm() / x.double().norm()) < BOUND[spec]
    if spec.startswith("none"):
        assert torch.equal(y, x)


@pytest.mark.parametrize("spec", SPECS)
def test_zero_element_and_scalar_tensors(spec: str) -> None:
    codec = get_codec(spec)
    for x in (torch.empty(0), torch.empty(3, 0, 2), torch.tensor(2.5)):
        y = codec.decode(codec.encode(x, key=1))
        assert y.shape == x.shape


def test_non_contiguous_input_equals_contiguous() -> None:
    x = _x((64, 96)).t()
    assert not x.is_contiguous()
    c = get_codec("int8:block=64")
    assert c.encode(x) == c.encode(x.contiguous())


def test_float8_inputs_roundtrip() -> None:
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("torch without float8")
    x = _x((100,)).to(torch.float8_e4m3fn)
    for spec in ("none", "int8", "bf16"):
        y = get_codec(spec).decode(get_codec(spec).encode(x))
        assert y.dtype == torch.float8_e4m3fn
        if spec != "int8":  # bf16 holds every e4m3 value exactly
            assert torch.equal(y.float(), x.float())


def test_nonfinite_is_an_error_by_default_and_zeroed_on_request() -> None:
    x = _x((256,))
    x[3], x[10], x[20] = float("nan"), float("inf"), -float("inf")
    with pytest.raises(NonFiniteError):
        get_codec("int8").encode(x)
    y = get_codec("int8", nonfinite="zero").decode(get_codec("int8", nonfinite="zero").encode(x))
    assert float(y[3]) == float(y[10]) == float(y[20]) == 0.0
    assert bool(torch.isfinite(y).all())


def test_large_finite_values_are_not_mistaken_for_nonfinite() -> None:
    x = torch.full((1000,), 3.0e38)  # the fp32 sum overflows; the elements are finite
    y = get_codec("bf16").decode(get_codec("bf16").encode(x))
    assert bool(torch.isfinite(y).all())


def test_fp16_prescaling_keeps_tiny_values_and_sums_do_not_overflow() -> None:
    c = get_codec("fp16")
    tiny = _x((1000,)) * 1e-7  # mostly fp16 subnormal without scaling
    assert float((c.decode(c.encode(tiny)) - tiny).norm() / tiny.norm()) < 1e-3
    big = torch.full((8,), 60000.0)
    acc = torch.zeros(8)
    for _ in range(64):
        c.decode_into(c.encode(big), acc)
    assert bool(torch.isfinite(acc).all()) and float(acc[0]) == 64 * 60000.0


def test_native_bf16_passes_through_bit_exact() -> None:
    x = _x((513,), torch.bfloat16)
    data = get_codec("bf16").encode(x)
    assert len(data) < 2 * 513 + 64
    assert torch.equal(get_codec("bf16").decode(data), x)


def test_integer_tensors_are_rejected() -> None:
    with pytest.raises(EncodeError):
        get_codec("int8").encode(torch.arange(10))


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "int9",
        "int8:block=48",
        "int8:block=64,foo=1",
        "int8|topk",
        "zstd|int8",
        "int8|int4",
        "topk:density=2",
    ],
)
def test_bad_specs_raise_spec_error(bad: str) -> None:
    with pytest.raises(SpecError):
        get_codec(bad)


def test_canonical_spec_drops_defaults() -> None:
    assert get_codec("int8:block=64").spec == "int8"
    assert get_codec("topk:density=0.01|int4:block=32|zstd").spec == "topk|int4:block=32|zstd"


def test_estimate_bytes_is_exact_for_fixed_size_chains() -> None:
    for spec in (
        "none",
        "fp16",
        "bf16",
        "int8",
        "int4:block=32",
        "int2",
        "randk:density=0.1|int8",
        "powersgd|bf16",
    ):
        c = get_codec(spec)
        x = _x((40, 50))
        assert c.estimate_bytes(x.shape) == len(c.encode(x, key=1)), spec


def test_corruption_and_truncation_raise_decode_error() -> None:
    data = bytearray(get_codec("int4|zstd").encode(_x((300,)), key=9))
    for i in range(0, len(data), 7):
        bad = bytearray(data)
        bad[i] ^= 0x40
        with pytest.raises(DecodeError):
            decode(bytes(bad))
    for cut in (0, 3, FIXED_SIZE, len(data) // 2, len(data) - 1):
        with pytest.raises(DecodeError):
            decode(bytes(data[:cut]))


def _reseal(buf: bytearray) -> bytes:
    return seal(buf)


def test_absurd_shape_is_rejected_before_allocating() -> None:
    data = bytearray(get_codec("int8").encode(_x((4, 4))))
    struct.pack_into("<QQ", data, FIXED_SIZE, 2**40, 2**40)  # 2^80 elements, valid CRC
    with pytest.raises(DecodeError, match="elements"):
        decode(_reseal(data))
    data = bytearray(get_codec("int8").encode(_x((4, 4))))
    struct.pack_into("<QQ", data, FIXED_SIZE, 40, 5)  # plausible shape, payload too small for it
    with pytest.raises(DecodeError):
        decode(_reseal(data))


def test_unknown_version_and_spec_are_decode_errors() -> None:
    data = bytearray(get_codec("int8").encode(_x((4,))))
    data[4] = 99
    with pytest.raises(DecodeError, match="version"):
        decode(_reseal(data))
    data = bytearray(get_codec("int8").encode(_x((4,))))
    spec_at = FIXED_SIZE + 8
    data[spec_at : spec_at + 4] = b"int9"
    with pytest.raises(DecodeError):
        decode(_reseal(data))


def test_header_is_little_endian_and_carries_key_and_shape() -> None:
    data = get_codec("int8").encode(_x((3, 5)), key=0x0102030405060708)
    assert data[:4] == b"PLKC" and data[4] == 2 and data[6] == 2
    assert struct.unpack_from("<Q", data, 16)[0] == 0x0102030405060708
    assert struct.unpack_from("<QQ", data, 24) == (3, 5)
    assert data[40:44] == b"int8"


def test_decode_into_rejects_wrong_shape() -> None:
    data = get_codec("int8").encode(_x((10,)))
    with pytest.raises(DecodeError):
        get_codec("int8").decode_into(data, torch.zeros(11))


def crc32c_bitwise(data: bytes) -> int:
    """CRC32C one bit at a time, straight from the definition (reflected polynomial 0x82F63B78)."""
    c = 0xFFFFFFFF
    for byte in data:
        c ^= byte
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


@pytest.mark.parametrize("version", [1, 2])
def test_golden_int8_payload_built_from_the_spec_by_hand(version: int) -> None:
    # docs/wire-format.md, rebuilt independently: header, spec, section table, scales, codes, checksum
    s_bits = ((struct.unpack("<I", struct.pack("<f", 1.0 / 127))[0] + 0xFFFF) & 0xFFFF0000) >> 16
    s = struct.unpack("<f", struct.pack("<I", s_bits << 16))[0]
    codes = [round(1.0 / s) + 128, -round(0.5 / s) + 128] + [128] * 62  # s rounded up: 1.0 -> 126
    payload = struct.pack("<B", 2) + struct.pack("<BBII", 2, 0, 2, 2) + struct.pack("<BBII", 1, 0, 64, 64)
    payload += struct.pack("<H", s_bits) + bytes(codes)
    body = struct.pack("<4sBBBBHHIQ", b"PLKC", version, 1, 1, 1, 4, 0, len(payload), 7)
    body += struct.pack("<Q", 2) + b"int8" + payload
    crc = zlib.crc32(body) if version == 1 else crc32c_bitwise(body)
    want = body + struct.pack("<I", crc)
    assert crc32c_bitwise(b"123456789") == 0xE3069283  # the check value of the CRC-32C catalogue entry
    x = torch.tensor([1.0, -0.5])
    got = get_codec("int8").encode(x, key=7, version=version)
    assert got == want
    assert bytes(get_codec("int8").encode_into(x, bytearray(len(want) + 9), key=7, version=version)) == want
    assert torch.equal(decode(want), decode(got))
