"""``powersgd``: rank-r approximation M ~ P Q^T by one power iteration with warm start (Vogels et al.).

The tensor is viewed as a matrix [shape[0], numel / shape[0]] (1-D tensors as a column). Per encode:
    Q  <- warm start from the caller's ErrorFeedback state, else a deterministic hash-uniform matrix
    P  =  orthonormalize(M Q);  Q = M^T P;  send [P, Q] through the chain's value stage
The decoder returns P Q^T. Error feedback (the caller's ErrorFeedback) adds M - P Q^T to the next M.
When r (m + c) >= m c the factors would be larger than M, so M itself is sent (meta flag ``dense``).
Meta section: ``u32 m, u32 c, u16 r, u8 dense``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import torch

from potluck.compression.errors import DecodeError
from potluck.compression.feedback import ErrorFeedback
from potluck.compression.hashing import stream_seed, uniform
from potluck.compression.spec import Param
from potluck.compression.stages.base import SectionReader, StageCtx, TransformStage
from potluck.compression.wire import Section

_META = struct.Struct("<IIHB")


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    n = math.prod(shape)
    if len(shape) < 2 or n == 0:
        return n, 1
    return shape[0], n // shape[0]


class PowerSGDStage(TransformStage):
    PARAMS: ClassVar[dict[str, Param]] = {
        "rank": Param(int, 4, lambda v: None if 1 <= v <= 1024 else "must be 1..1024"),
        "seed": Param(int, 0, lambda v: None if 0 <= v < 2**63 else "must be in 0..2^63-1"),
    }
    meta_bytes = _META.size
    SALT = 3

    def _plan(self, shape: tuple[int, ...]) -> tuple[int, int, int, bool]:
        m, c = matrix_shape(shape)
        r = min(self.p["rank"], m, c)
        return m, c, r, r * (m + c) >= m * c

    def vector_len(self, shape: tuple[int, ...]) -> int:
        m, c, r, dense = self._plan(shape)
        return m * c if dense else r * (m + c)

    def forward(
        self, x: torch.Tensor, ctx: StageCtx
    ) -> tuple[list[Section], torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
        m, c, r, dense = self._plan(ctx.shape)
        meta = [Section(np.frombuffer(_META.pack(m, c, r, int(dense)), dtype=np.uint8).copy())]
        if dense:
            return meta, x.clone(), lambda v: v
        mat = x.view(m, c)
        state = ctx.state if isinstance(ctx.state, ErrorFeedback) else None
        q = state.extras.get("powersgd_q") if state is not None else None
        if q is None or q.shape != (c, r):
            seed = stream_seed(ctx.key64 or 0, self.p["seed"], self.SALT)
            q = (uniform(c * r, seed, device=x.device) - 0.5).view(c, r)
        p = torch.linalg.qr(mat @ q).Q
        q = mat.T @ p
        if state is not None:
            state.extras["powersgd_q"] = q
        vec = torch.cat([p.reshape(-1), q.reshape(-1)])
        return meta, vec, self._back(m, c, r)

    @staticmethod
    def _back(m: int, c: int, r: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def back(v: torch.Tensor) -> torch.Tensor:
            p = v[: m * r].view(m, r)
            q = v[m * r :].view(c, r)
            return (p @ q.T).reshape(-1)

        return back

    def inverse(
        self, r: SectionReader, n: int, ctx: StageCtx
    ) -> tuple[int, Callable[[torch.Tensor], torch.Tensor]]:
        m, c, rank, dense = _META.unpack(r.take(_META.size, "powersgd meta").tobytes())
        if (m, c, rank, bool(dense)) != self._plan(ctx.shape):
            raise DecodeError(f"powersgd meta {(m, c, rank, dense)} does not match shape {ctx.shape}")
        if dense:
            return n, lambda v: v
        return rank * (m + c), self._back(m, c, rank)
