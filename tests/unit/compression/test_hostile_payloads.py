"""Payloads an attacker builds by hand: refused by a strict decode (the receiver names its codec and
the shape it expects) after the fixed header, before any section is decompressed or tensor allocated."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from potluck.compression import DecodeError, get_codec
from potluck.compression.wire import Header, Section, pack, seal

SHAPE = (4, 8, 16)


def _bomb(raw_len: int, stated: int, shape: tuple[int, ...] = SHAPE, spec: str = "none|zstd") -> bytes:
    """A raw-float payload whose one zstd section is a frame of ``stated`` zero bytes, declared (in the
    section table) as ``raw_len`` bytes: what a hostile sender puts on the wire."""
    frame = zstandard.ZstdCompressor(level=19).compress(bytes(stated))
    section = Section(np.frombuffer(frame, dtype=np.uint8), 4, True, raw_len)
    return pack(Header(torch.float32, shape, spec, None, 0), [section])


def test_an_honest_payload_decodes_strictly() -> None:
    codec = get_codec("int8|zstd")
    x = torch.randn(SHAPE)
    y = codec.decode(codec.encode(x), expect=SHAPE)
    assert y.shape == SHAPE and float((y - x).abs().max()) < 0.1
    acc = torch.zeros(SHAPE)
    codec.decode_into(codec.encode(x), acc)
    assert float((acc - x).abs().max()) < 0.1


def test_a_codec_the_link_does_not_use_is_refused() -> None:
    data = get_codec("none|zstd").encode(torch.zeros(SHAPE))
    with pytest.raises(DecodeError, match="this link carries 'int8'"):
        get_codec("int8").decode(data, expect=SHAPE)
    with pytest.raises(DecodeError, match="this link carries"):
        get_codec("int8").decode_into(data, torch.zeros(SHAPE))


def test_a_shape_other_than_expected_is_refused() -> None:
    codec = get_codec("int8")
    with pytest.raises(DecodeError, match="expected"):  # as many elements, another shape
        codec.decode(codec.encode(torch.zeros(8, 4, 16)), expect=SHAPE)
    data = codec.encode(torch.zeros(4, 8, 17))
    with pytest.raises(DecodeError, match="elements"):
        codec.decode(data, expect=SHAPE)
    with pytest.raises(DecodeError, match="elements"):
        codec.decode_into(data, torch.zeros(SHAPE))


def test_a_declared_size_past_the_tensor_is_refused_before_zstd_runs() -> None:
    # 1 MiB declared and stated for a 2 KiB tensor: refused from the section table alone
    numel = 4 * 8 * 16
    with pytest.raises(DecodeError, match="raw bytes"):
        get_codec("none|zstd").decode(_bomb(1 << 20, 1 << 20), expect=SHAPE)
    # a frame that states more than its table entry: refused from the frame header alone
    with pytest.raises(DecodeError, match="states"):
        get_codec("none|zstd").decode(_bomb(numel * 4, 1 << 20), expect=SHAPE)


@pytest.mark.slow  # a fresh process, so that its peak resident size is the decoder's
def test_the_decompression_bomb_costs_no_memory() -> None:
    # The attack that was measured: a ~32 KiB payload whose frame states 1 GiB. In a fresh process, so
    # that the peak resident size says what decoding it cost.
    script = textwrap.dedent(
        """
        import resource, torch
        from tests.unit.compression.test_hostile_payloads import _bomb
        from potluck.compression import DecodeError, get_codec
        bomb = _bomb(4 * 512, 1 << 30, (512,))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for decoder in (lambda: get_codec("none|zstd").decode(bomb, expect=(512,)),
                        lambda: get_codec("none|zstd").decode_into(bomb, torch.zeros(512))):
            try:
                decoder()
                raise SystemExit("decoded")
            except DecodeError:
                pass
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(len(bomb), grew)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    size, grew_kib = map(int, out.stdout.split())
    assert size < 64 << 10
    assert grew_kib < 64 << 10, f"decoding a {size}-byte bomb grew the process by {grew_kib} KiB"


def test_a_topk_payload_declaring_a_huge_tensor_is_refused_by_its_shape() -> None:
    codec = get_codec("topk:density=0.01|int8")
    small = codec.encode(torch.randn(100))
    huge = bytearray(small)
    # rewrite the one dim (offset 24) to 2^28 and reseal: the payload now "holds" 1 GiB of fp32
    huge[24:32] = (1 << 28).to_bytes(8, "little")
    huge[-4:] = zlib_crc(bytes(huge[:-4]))
    with pytest.raises(DecodeError, match="elements"):
        codec.decode(bytes(huge), expect=(100,))
    with pytest.raises(DecodeError, match="elements"):
        codec.decode_into(bytes(huge), torch.zeros(100))


def zlib_crc(data: bytes) -> bytes:
    """The trailer a forger computes for ``data`` (a payload without its last 4 bytes)."""
    return seal(bytearray(data) + b"\0\0\0\0")[-4:]


SPECS = ["int8", "int4:block=32|zstd", "topk:density=0.1|int2|zstd", "bf16|zstd", "powersgd:rank=1|int8"]
_SEEDS = {
    s: get_codec(s).encode(torch.randn(24, 20, generator=torch.Generator().manual_seed(i)))
    for i, s in enumerate(SPECS)
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=st.sampled_from(SPECS),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
    reseal=st.booleans(),
)
def test_strict_decode_of_mutated_payloads_yields_the_shape_or_a_decode_error(spec, edits, reseal) -> None:
    buf = bytearray(_SEEDS[spec])
    for pos, val in edits:
        buf[pos % len(buf)] = val
    if reseal:
        buf[-4:] = zlib_crc(bytes(buf[:-4]))
    codec = get_codec(spec)
    try:
        out = codec.decode(bytes(buf), expect=(24, 20))
    except DecodeError:
        return
    assert out.shape == (24, 20)
