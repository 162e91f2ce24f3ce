"""The native one-pass CPU codec: same bytes as the torch reference, CRC32C, wire versions 1 and 2."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import zlib

import numpy as np
import pytest
import torch

from potluck.compression import DecodeError, EncodeError, ErrorFeedback, NonFiniteError, decode, get_codec
from potluck.compression import checksum as ck
from potluck.compression.kernels import native, native_ops
from potluck.compression.stages.quantize import quantize, scales_from_bits
from potluck.compression.wire import CRC_SIZE, seal

from .golden import CASES, FIXTURES, KEY, inputs, payload_for

pytestmark = pytest.mark.skipif(native.lib() is None, reason="no C compiler: the native kernels cannot build")


def eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch the process to the torch eager path (native.lib() then returns None)."""
    monkeypatch.setenv("POTLUCK_CODEC_BACKEND", "eager")


def nasty(n: int, seed: int) -> torch.Tensor:
    """Gaussian values with zeros, -0.0, subnormals, huge values and a constant block mixed in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 3)
    if n > 200:
        x[:64] = 0.0
        x[64:70] = -0.0
        x[70:80] = 1e-41  # subnormal: the scale underflows to 0 and the block divides by 1
        x[80:84] = 3e38  # the scale clamps to the largest finite bf16
        x[130:194] = 0.25
    return x


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("block", [32, 64, 4096])
@pytest.mark.parametrize("n", [1, 31, 1000, 4097, 70_001])
def test_native_sections_equal_the_reference_quantizer(bits: int, block: int, n: int) -> None:
    x = nasty(n, bits * 7 + n)
    for rounding, seed in (("nearest", None), ("stochastic", (0x1234567, 0x89ABCDEF))):
        ref = quantize(x, bits, block, seed, want_recon=True)
        resid = torch.empty(n)
        sbits, packed, finite = native_ops.quantize(x, None, resid, block, bits, seed)
        assert finite
        assert torch.equal(sbits, ref.scale_bits), rounding
        assert torch.equal(packed, ref.packed), rounding
        assert ref.recon is not None
        assert torch.equal(resid, x - ref.recon), rounding  # error feedback: x minus what is decoded
        back = torch.empty(n)
        native_ops.dequantize_to(packed.data_ptr(), sbits.data_ptr(), n, block, bits, back, False)
        assert torch.equal(back, ref.recon)
        assert bool((scales_from_bits(sbits) >= 0).all())


SPECS = ["int8", "int4:block=32", "int2:block=128", "int4:rounding=stochastic,seed=3", "int8:block=4096"]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("n", [5, 3000, 600_001])  # the last one is split across threads
def test_whole_payloads_and_feedback_equal_the_torch_path(
    spec: str, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    codec = get_codec(spec)
    xs = [nasty(n, s).clamp(-1e37, 1e37) for s in range(3)]  # x + residual must not overflow fp32
    ef_native, ef_torch = ErrorFeedback(), ErrorFeedback()
    fast = [codec.encode(x, key=(9, i), state=ef_native) for i, x in enumerate(xs)]
    with monkeypatch.context() as m:
        eager(m)
        slow = [codec.encode(x, key=(9, i), state=ef_torch) for i, x in enumerate(xs)]
        slow_v1 = codec.encode(xs[0], key=(9, 0), version=1)
    assert fast == slow
    assert ef_native.residual is not None and ef_torch.residual is not None
    assert torch.equal(ef_native.residual, ef_torch.residual)
    assert codec.encode(xs[0], key=(9, 0), version=1) == slow_v1
    acc_fast, acc_slow = torch.ones(n), torch.ones(n)
    codec.decode_into(fast[0], acc_fast)
    with monkeypatch.context() as m:
        eager(m)
        codec.decode_into(fast[0], acc_slow)  # also checks the numpy CRC32C of a version-2 payload
        assert torch.equal(codec.decode(fast[1]), decode(fast[1]))
    assert torch.equal(acc_fast, acc_slow)


def test_encode_into_a_reused_buffer() -> None:
    codec = get_codec("int8")
    x = nasty(10_000, 1)
    want = codec.encode(x, key=1)
    buf = bytearray(codec.estimate_bytes(x.shape) + 100)
    view = codec.encode_into(x, buf, key=1)
    assert bytes(view) == want and len(view) == len(want)
    arr = np.zeros(len(want), dtype=np.uint8)
    assert bytes(codec.encode_into(x, arr, key=1)) == want
    with pytest.raises(EncodeError, match="needs"):
        codec.encode_into(x, bytearray(len(want) - 1), key=1)
    with pytest.raises(EncodeError, match="writable"):
        codec.encode_into(x, bytes(len(want)), key=1)
    zstd = get_codec("int8|zstd")  # a chain the one-pass writer does not take still fills the buffer
    assert bytes(zstd.encode_into(x, buf, key=1)) == zstd.encode(x, key=1)


def test_nonfinite_inputs_leave_the_feedback_state_alone() -> None:
    codec = get_codec("int4")
    ef = ErrorFeedback()
    x = nasty(5000, 2)
    codec.encode(x, state=ef)
    assert ef.residual is not None
    before = ef.residual.clone()
    bad = x.clone()
    bad[4321] = float("nan")
    with pytest.raises(NonFiniteError):
        codec.encode(bad, state=ef)
    assert torch.equal(ef.residual, before) and ef.steps == 1
    zero = get_codec("int4", nonfinite="zero")
    clean = bad.clone()
    clean[4321] = 0.0
    assert zero.encode(bad, key=2) == zero.encode(clean, key=2)


def test_version_one_goldens_still_decode_and_are_reproduced() -> None:
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    assert len(manifest) == len(CASES)
    for case, (name, spec, shape, ef_steps) in enumerate(CASES):
        golden = (FIXTURES / f"v1_{name}.bin").read_bytes()
        assert golden[4] == 1
        values = decode(golden).float().contiguous().numpy().tobytes()
        assert hashlib.sha256(values).hexdigest() == manifest[name]["decoded_sha256"], name
        assert payload_for(spec, shape, ef_steps, case, version=1) == golden, name
        v2 = payload_for(spec, shape, ef_steps, case, version=2)
        assert v2[4] == 2 and len(v2) == len(golden), name
        assert v2[:4] + v2[5:-CRC_SIZE] == golden[:4] + golden[5:-CRC_SIZE], name  # the same sections
        assert int.from_bytes(v2[-4:], "little") == ck.crc32c(v2[:-4])
        assert torch.equal(decode(v2), decode(golden))


def test_a_payload_sealed_with_the_other_versions_checksum_is_refused() -> None:
    x = inputs((700,), 0)
    v2 = bytearray(get_codec("int8").encode(x, key=KEY))
    v2[-4:] = zlib.crc32(bytes(v2[:-4])).to_bytes(4, "little")  # a version-1 trailer on a v2 payload
    with pytest.raises(DecodeError, match="checksum"):
        decode(bytes(v2))
    assert torch.equal(decode(seal(v2)), decode(get_codec("int8").encode(x, key=KEY)))


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 4095, 12_288, 12_289, 100_003, 2_000_001])
def test_crc32c_native_numpy_and_combine_agree(n: int) -> None:
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    want = ck.crc32c(data)
    if n <= 100_003:
        assert ck._crc32c_numpy(np.frombuffer(data, dtype=np.uint8), 0) == want
    cut = n // 3
    assert ck.crc32c(data[cut:], ck.crc32c(data[:cut])) == want
    assert ck.crc32c_combine(ck.crc32c(data[:cut]), ck.crc32c(data[cut:]), n - cut) == want
    assert ck._mulmod(ck._shift_op(n - cut), ck.crc32c(data[:cut])) ^ ck.crc32c(data[cut:]) == want


def test_crc32c_known_answers() -> None:
    assert ck.crc32c(b"123456789") == 0xE3069283
    assert ck.crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4: 32 bytes of zeros
    assert ck.crc32c(bytes([0xFF] * 32)) == 0x62A8AB43  # RFC 3720 B.4: 32 bytes of ones
    assert ck.crc32c(bytes(range(32))) == 0x46DD794E  # RFC 3720 B.4: incrementing


@pytest.mark.slow  # compiles the kernels into a fresh cache
def test_build_is_cached_and_a_missing_compiler_is_survived(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POTLUCK_KERNEL_CACHE", str(tmp_path))
    first = native.build()
    assert first is not None and first.parent == tmp_path
    stamp = first.stat().st_mtime_ns
    assert native.build() == first and first.stat().st_mtime_ns == stamp  # no rebuild
    monkeypatch.setenv("POTLUCK_KERNEL_CACHE", str(tmp_path / "other"))
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert native.build() is None


def _child_encode(x: torch.Tensor, q: mp.Queue) -> None:  # type: ignore[type-arg]
    q.put(get_codec("int8").encode(x, key=3))


def test_thread_pool_survives_fork() -> None:
    # the tensor is made before the fork: torch's own OpenMP pool hangs in a forked child (a torch
    # limitation hivemind's peers live with too); only our codec pool's fork handler is under test
    x = nasty(600_001, 5)
    want = get_codec("int8").encode(x, key=3)  # starts the codec pool in the parent
    ctx = mp.get_context("fork")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    p = ctx.Process(target=_child_encode, args=(x, q), daemon=True)
    p.start()
    try:
        got = q.get(timeout=60)
    finally:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join(timeout=10)
    assert got == want


@pytest.mark.slow  # compiles a portable build and loads it in a fresh process
def test_a_portable_build_named_by_the_environment_gives_the_same_bytes(tmp_path: os.PathLike[str]) -> None:
    import subprocess
    import sys
    from pathlib import Path

    lib = native.build(portable=True, out=Path(tmp_path) / "plk_portable.so")
    assert lib is not None and native.load(lib) is not None
    assert lib.stat().st_mode & 0o555 == 0o555  # an image builds it as root and runs as another user
    code = (
        "import sys, torch\n"
        "from potluck.compression import get_codec\n"
        "from potluck.compression.kernels import native\n"
        "g = torch.Generator().manual_seed(11)\n"
        "x = torch.randn(300_001, generator=g)\n"
        "assert native.lib() is not None and native.lib()._name == sys.argv[1]\n"
        "sys.stdout.buffer.write(get_codec('int4:rounding=stochastic').encode(x, key=4))\n"
    )
    env = {**os.environ, "POTLUCK_KERNEL_LIB": str(lib), "POTLUCK_CODEC_BACKEND": "native"}
    out = subprocess.run([sys.executable, "-c", code, str(lib)], env=env, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    x = torch.randn(300_001, generator=torch.Generator().manual_seed(11))
    assert out.stdout == get_codec("int4:rounding=stochastic").encode(x, key=4)


def test_the_environment_picks_the_written_version_for_a_two_step_upgrade(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = inputs((900,), 3)
    codec = get_codec("int4")
    assert codec.encode(x)[4] == 2
    monkeypatch.setenv("POTLUCK_WIRE_VERSION", "1")
    old = codec.encode(x)
    assert old[4] == 1 and get_codec("int8|zstd").encode(x)[4] == 1
    assert torch.equal(decode(old), decode(codec.encode(x, version=2)))
    monkeypatch.setenv("POTLUCK_WIRE_VERSION", "3")
    with pytest.raises(EncodeError, match="POTLUCK_WIRE_VERSION"):
        codec.encode(x)


@pytest.mark.slow  # compiles a build without the CRC32 instruction
@pytest.mark.skipif(
    os.uname().machine not in ("x86_64", "AMD64"), reason="forces x86's table-driven CRC path"
)
def test_the_table_driven_crc_build_agrees_with_the_instruction(tmp_path: os.PathLike[str]) -> None:
    import ctypes
    from pathlib import Path

    out = Path(tmp_path) / "plk_table.so"
    assert native._compile(os.environ.get("CC", "cc"), out, "-mno-sse4.2")  # no CRC32 instruction
    table = native.load(out)  # checks the known answer of "123456789" itself
    fast = native.lib()
    assert table is not None and fast is not None
    assert table.plk_crc_impl() == b"table" and fast.plk_crc_impl() != b"table"
    data = np.random.default_rng(5).integers(0, 256, 100_003, dtype=np.uint8)
    ptr = data.ctypes.data
    assert table.plk_crc32c(0, ptr, data.size) == fast.plk_crc32c(0, ptr, data.size)
    x = nasty(20_000, 9)
    outs = []
    for lib in (table, fast):
        sc, cd = np.zeros(2 * 313, np.uint8), np.zeros(20_032, np.uint8)
        crcs = (ctypes.c_uint32 * 2)()
        rc = lib.plk_quantize(x.data_ptr(), None, None, x.numel(), 0, 313, 64, 8, 0, 0, 0, 0, 0,
                              sc.ctypes.data, cd.ctypes.data, ctypes.addressof(crcs))  # fmt: skip
        assert rc == 1
        outs.append((sc.tobytes(), cd.tobytes(), tuple(crcs)))
    assert outs[0] == outs[1]
