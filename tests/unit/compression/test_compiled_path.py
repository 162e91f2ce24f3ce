"""torch.compile'd CPU path == eager path, byte for byte (compiling costs ~10-30 s once per process)."""

from __future__ import annotations

import pytest
import torch

from potluck.compression import ErrorFeedback, get_codec
from potluck.compression.kernels import cpu


@pytest.mark.slow
def test_compiled_cpu_path_gives_eager_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.randn(64 * 300 + 17, generator=torch.Generator().manual_seed(0)) ** 3
    results: dict[str, list[bytes | torch.Tensor]] = {}
    for backend in ("eager", "compile"):
        monkeypatch.setenv("POTLUCK_CODEC_BACKEND", backend)
        out: list[bytes | torch.Tensor] = []
        for spec in ("int8", "int4:rounding=stochastic", "int2:block=128"):
            ef = ErrorFeedback()
            codec = get_codec(spec)
            for rnd in range(2):
                data = codec.encode(g, key=rnd, state=ef)
                acc = torch.ones_like(g)
                codec.decode_into(data, acc)
                assert ef.residual is not None
                out += [data, ef.residual.clone(), codec.decode(data), acc]
        results[backend] = out
    assert not cpu._broken, "torch.compile failed; the compiled path was not exercised"
    for a, b in zip(results["eager"], results["compile"], strict=True):
        assert a == b if isinstance(a, bytes) else torch.equal(a, b)  # type: ignore[arg-type]
