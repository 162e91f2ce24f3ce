"""Value stages that cast: ``none`` (raw, original dtype), ``fp32``, ``fp16`` (pre-scaled) and ``bf16``.

fp16 pre-scaling: the tensor is multiplied by 2^-e, a power of two (exact), chosen so that its absmax
lands below 2^(16 - headroom). With the default headroom of 6 bits, sums of up to 64 payloads cannot
overflow fp16, and tiny gradients use fp16's normal range instead of its subnormals.
"""

from __future__ import annotations

import math
import struct
from typing import ClassVar

import numpy as np
import torch

from potluck.compression.errors import DecodeError
from potluck.compression.spec import Param
from potluck.compression.stages.base import SectionReader, StageCtx, ValueStage, tensor_from
from potluck.compression.wire import Section, as_bytes_array


def ldexp(x: torch.Tensor, e: int) -> torch.Tensor:
    """x * 2^e, exact, in at most two multiplies so that 2^e itself never overflows fp32."""
    while e:
        step = max(-126, min(126, e))
        x = x * (2.0**step)
        e -= step
    return x


class RawStage(ValueStage):
    """``none``: the values in the tensor's own dtype (lossless); ``fp32``: cast to fp32."""

    PARAMS: ClassVar[dict[str, Param]] = {}

    def _dtype(self, ctx: StageCtx) -> torch.dtype:
        return torch.float32 if self.name == "fp32" else ctx.dtype

    def encode(
        self, x: torch.Tensor, ctx: StageCtx, want_recon: bool
    ) -> tuple[list[Section], torch.Tensor | None]:
        # a copy when EF will later update x in place (the section must not alias it)
        v = x.to(self._dtype(ctx), copy=want_recon).contiguous()
        recon = v.to(torch.float32) if want_recon else None
        return [Section(as_bytes_array(v), v.element_size())], recon

    def decode(self, r: SectionReader, n: int, ctx: StageCtx) -> torch.Tensor:
        dt = self._dtype(ctx)
        width = torch.empty(0, dtype=dt).element_size()
        return tensor_from(r.take(n * width, "raw values"), dt).clone()  # never alias the payload

    def nbytes(self, n: int, dtype: torch.dtype) -> int:
        return n * (4 if self.name == "fp32" else torch.empty(0, dtype=dtype).element_size())


class Fp16Stage(ValueStage):
    n_sections = 2
    PARAMS: ClassVar[dict[str, Param]] = {
        "headroom": Param(int, 6, lambda v: None if 0 <= v <= 14 else "must be 0..14 bits")
    }

    def encode(
        self, x: torch.Tensor, ctx: StageCtx, want_recon: bool
    ) -> tuple[list[Section], torch.Tensor | None]:
        x = x.to(torch.float32)
        amax = float(x.abs().max()) if x.numel() else 0.0
        e = 0 if amax == 0.0 else math.frexp(amax)[1] - (16 - self.p["headroom"])
        h = ldexp(x, -e).to(torch.float16)
        meta = np.frombuffer(struct.pack("<i", e), dtype=np.uint8)
        recon = ldexp(h.to(torch.float32), e) if want_recon else None
        return [Section(meta.copy(), 4), Section(as_bytes_array(h), 2)], recon

    def _read(self, r: SectionReader, n: int) -> tuple[int, torch.Tensor]:
        (e,) = struct.unpack("<i", r.take(4, "fp16 exponent").tobytes())
        if not -300 <= e <= 300:
            raise DecodeError(f"fp16 scale exponent {e} is out of range")
        return e, tensor_from(r.take(2 * n, "fp16 values"), torch.float16)

    def decode(self, r: SectionReader, n: int, ctx: StageCtx) -> torch.Tensor:
        e, h = self._read(r, n)
        return ldexp(h.to(torch.float32), e)

    def nbytes(self, n: int, dtype: torch.dtype) -> int:
        return 4 + 2 * n


class Bf16Stage(ValueStage):
    PARAMS: ClassVar[dict[str, Param]] = {}

    def encode(
        self, x: torch.Tensor, ctx: StageCtx, want_recon: bool
    ) -> tuple[list[Section], torch.Tensor | None]:
        h = x.to(torch.bfloat16).contiguous()
        return [Section(as_bytes_array(h), 2)], (h.to(torch.float32) if want_recon else None)

    def decode(self, r: SectionReader, n: int, ctx: StageCtx) -> torch.Tensor:
        v = tensor_from(r.take(2 * n, "bf16 values"), torch.bfloat16)
        return v.clone() if ctx.dtype == torch.bfloat16 else v.to(torch.float32)

    def nbytes(self, n: int, dtype: torch.dtype) -> int:
        return 2 * n
