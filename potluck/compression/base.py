"""``Codec``: a chain of stages that turns a tensor into one self-describing payload and back."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from potluck.compression import onepass
from potluck.compression.errors import DecodeError, EncodeError, NonFiniteError
from potluck.compression.feedback import ErrorFeedback
from potluck.compression.hashing import KeyLike, key_to_u64
from potluck.compression.stages.base import (
    LosslessStage,
    SectionReader,
    SelectStage,
    Stage,
    StageCtx,
    TransformStage,
    ValueStage,
)
from potluck.compression.stages.quantize import QuantStage
from potluck.compression.wire import (
    CRC_SIZE,
    DTYPE_CODES,
    FIXED_SIZE,
    MAX_ELEMENTS,
    Header,
    Section,
    pack,
    unpack_header,
    unpack_sections,
    write_version,
)

SpecResolver = Callable[[str], "Codec"]


def all_finite(t: torch.Tensor) -> bool:
    """Whether ``t`` holds no NaN or Inf, in one read-only pass: a finite float64 sum implies every
    element is finite (only when the sum is not, the elements are looked at one by one)."""
    return t.numel() == 0 or math.isfinite(float(t.sum(dtype=torch.float64))) or bool(torch.isfinite(t).all())


def raw_bound(numel: int) -> int:
    """Most decompressed section bytes any chain needs for ``numel`` elements: values of up to 8 bytes,
    positions of up to 4 and low-rank factors within that, plus 64 KiB of metadata. A payload declaring
    more is refused before zstd runs, so a small payload cannot inflate far past its tensor's size."""
    return 12 * numel + (64 << 10)


class Codec:
    """Encode/decode tensors with one codec chain. Thread-safe: all mutable state is the caller's."""

    def __init__(
        self,
        stages: list[Stage],
        resolver: SpecResolver,
        nonfinite: str = "error",
        max_elements: int = MAX_ELEMENTS,
    ) -> None:
        if nonfinite not in ("error", "zero"):
            raise EncodeError(f"nonfinite must be 'error' or 'zero', not {nonfinite!r}")
        self.transform = next((s for s in stages if isinstance(s, TransformStage)), None)
        self.select = next((s for s in stages if isinstance(s, SelectStage)), None)
        value = next((s for s in stages if isinstance(s, ValueStage)), None)
        if value is None:
            raise EncodeError("a codec chain needs a value stage")
        self.value: ValueStage = value
        self.lossless = next((s for s in stages if isinstance(s, LosslessStage)), None)
        self.stages = stages
        self.spec = "|".join(s.canonical() for s in stages)
        self.nonfinite = nonfinite
        self.max_elements = max_elements
        self._resolve = resolver

    def __repr__(self) -> str:
        return f"Codec({self.spec!r})"

    # ---- encode -------------------------------------------------------------------------------
    def encode(
        self, tensor: torch.Tensor, *, key: KeyLike = None, state: Any = None, version: int | None = None
    ) -> bytes:
        """One payload for ``tensor``. ``key`` names (round, tensor, part) for shared random streams;
        ``state`` is an ``ErrorFeedback`` (or None) owned by the caller; ``version=1`` writes the
        previous format (zlib CRC32 trailer) for peers that cannot read version 2 (default: the
        newest, or ``POTLUCK_WIRE_VERSION``)."""
        payload = self._encode(tensor, key, state, write_version() if version is None else version, None)
        assert isinstance(payload, bytes)
        return payload

    def encode_into(
        self,
        tensor: torch.Tensor,
        out: bytearray | memoryview | np.ndarray,
        *,
        key: KeyLike = None,
        state: Any = None,
        version: int | None = None,
    ) -> memoryview:
        """Encode into a caller's writable buffer, reused across steps (no allocation and no page faults
        per call); returns the view of ``out`` that holds the payload. ``estimate_bytes`` sizes it
        (exact for chains without top-k or zstd)."""
        payload = self._encode(tensor, key, state, write_version() if version is None else version, out)
        if isinstance(payload, memoryview):
            return payload
        view = np.frombuffer(out, dtype=np.uint8).data
        if view.readonly or len(view) < len(payload):
            raise EncodeError(f"the output buffer must be writable and hold {len(payload)} bytes")
        view[: len(payload)] = payload
        return view[: len(payload)]

    def _encode(
        self,
        tensor: torch.Tensor,
        key: KeyLike,
        state: Any,
        version: int,
        out: bytearray | memoryview | np.ndarray | None,
    ) -> bytes | memoryview:
        if not isinstance(tensor, torch.Tensor):
            raise EncodeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in DTYPE_CODES:
            raise EncodeError(
                f"cannot encode dtype {tensor.dtype}: only floating-point tensors are supported"
            )
        if tensor.numel() > self.max_elements:
            raise EncodeError(
                f"{tensor.numel()} elements exceed the limit {self.max_elements}; split the tensor"
            )
        try:
            key64 = key_to_u64(key)
        except ValueError as exc:
            raise EncodeError(str(exc)) from exc
        if state is not None and not isinstance(state, ErrorFeedback):
            raise EncodeError(f"state must be an ErrorFeedback, got {type(state).__name__}")
        ef = state if isinstance(state, ErrorFeedback) and state.enabled else None
        ctx = StageCtx(tensor.dtype, tuple(tensor.shape), key64, state)
        flat = tensor.detach().reshape(-1)
        dense = self.transform is None and self.select is None and isinstance(self.value, QuantStage)
        header = Header(tensor.dtype, tuple(tensor.shape), self.spec, key64, 0)
        if dense and self.lossless is None and onepass.applies(flat):
            assert isinstance(self.value, QuantStage)
            return self._encode_onepass(self.value, header, flat, ctx, ef, out, version)
        if dense:
            # one fused pass; finiteness comes from the block maxima it computes anyway
            assert isinstance(self.value, QuantStage)
            res_in = ef.checked_residual(flat) if ef is not None else None
            spare = ef.spare_buffer(flat) if ef is not None else None
            sections, residual, finite = self.value.encode_dense(flat, res_in, ef is not None, ctx, spare)
            if not finite:
                flat = self._finite(flat)  # raises, or zeroes NaN/Inf and we run again
                res_in = torch.nan_to_num(res_in, 0.0, 0.0, 0.0) if res_in is not None else None
                sections, residual, _ = self.value.encode_dense(flat, res_in, ef is not None, ctx, spare)
        else:
            flat = self._finite(flat)
            sections, residual = self.encode_sections(flat, ctx, ef)
        if ef is not None and residual is not None:
            ef.store(residual)
        if self.lossless is not None:
            sections = self.lossless.compress(sections)
        return pack(header, sections, version)

    def _encode_onepass(
        self,
        stage: QuantStage,
        header: Header,
        flat: torch.Tensor,
        ctx: StageCtx,
        ef: ErrorFeedback | None,
        out: bytearray | memoryview | np.ndarray | None,
        version: int,
    ) -> bytes | memoryview:
        res_in = ef.checked_residual(flat) if ef is not None else None
        resid = ef.spare_buffer(flat) if ef is not None else None
        if ef is not None and resid is None:
            resid = torch.empty(flat.numel(), dtype=torch.float32)
        seed = stage.rounding_seed(ctx)
        done = onepass.encode(stage, header, flat, res_in, resid, seed, out, version)
        if done is None:
            flat = self._finite(flat)  # raises, or zeroes NaN/Inf and we run again
            res_in = torch.nan_to_num(res_in, 0.0, 0.0, 0.0) if res_in is not None else None
            done = onepass.encode(stage, header, flat, res_in, resid, seed, out, version)
            if done is None:  # finite inputs whose sum with the residual overflows
                raise NonFiniteError("tensor plus its error-feedback residual overflows fp32")
        payload, residual = done
        if ef is not None and residual is not None:
            ef.store(residual)
        return payload

    def _finite(self, flat: torch.Tensor) -> torch.Tensor:
        if all_finite(flat):
            return flat
        if self.nonfinite == "zero":
            return torch.nan_to_num(flat, nan=0.0, posinf=0.0, neginf=0.0)
        raise NonFiniteError(
            "tensor holds NaN or Inf; use get_codec(spec, nonfinite='zero') to send them as 0"
        )

    def encode_sections(
        self, flat: torch.Tensor, ctx: StageCtx, ef: ErrorFeedback | None
    ) -> tuple[list[Section], torch.Tensor | None]:
        """Run the lossy part of the chain; returns sections and the new residual (when ef is given)."""
        x = ef.apply(flat) if ef is not None else flat
        sections: list[Section] = []
        work, back = x, None
        if self.transform is not None:
            tsec, work, back = self.transform.forward(x.to(torch.float32), ctx)
            sections += tsec
        want = ef is not None
        if self.select is not None:
            ssec, pos = self.select.select(work, ctx)
            sections += ssec
            vsec, rvals = self.value.encode(work[pos], ctx, want)
            sections += vsec
            if not want or rvals is None:
                return sections, None
            scale = getattr(self.select, "value_scale", lambda _n: None)(work.numel())
            if scale is not None:
                rvals = rvals * scale.to(rvals.device)
            if back is None:
                work[pos] -= rvals  # work is ef.apply's fresh fp32 copy
                return sections, work
            recon_vec = torch.zeros_like(work, dtype=torch.float32)
            recon_vec[pos] = rvals
        else:
            vsec, recon = self.value.encode(work, ctx, want)
            sections += vsec
            if not want or recon is None:
                return sections, None
            if back is None:
                return sections, x.sub_(recon)
            recon_vec = recon
        assert back is not None
        return sections, x.sub_(back(recon_vec).reshape(-1))

    # ---- decode -------------------------------------------------------------------------------
    #
    # A payload from another machine is decoded *strictly*: the receiver says what it expects (this
    # codec's spec and the tensor's shape or element count) and everything else is refused after reading
    # the fixed header, before any section is decompressed or any tensor allocated. Only local data (a
    # round trip to measure a codec's error) is decoded loosely, naming its own codec.

    def _open(
        self, data: bytes | bytearray | memoryview, numel: int | None, shape: tuple[int, ...] | None
    ) -> tuple[Codec, Header, SectionReader, StageCtx]:
        header, off = unpack_header(data, self.max_elements if numel is None else numel)
        if numel is not None:
            if header.spec != self.spec:
                raise DecodeError(f"payload uses codec {header.spec!r}; this link carries {self.spec!r}")
            if header.numel != numel or (shape is not None and header.shape != shape):
                want = shape if shape is not None else f"{numel} elements"
                raise DecodeError(f"payload holds shape {header.shape}; expected {want}")
        codec = self if header.spec == self.spec else self._resolve(header.spec)
        sections = unpack_sections(data, off, header.payload_len)
        if codec.lossless is not None:
            raw = sum(sec.raw_len for sec in sections)
            if raw > raw_bound(header.numel):
                raise DecodeError(f"payload sections declare {raw} raw bytes for {header.numel} elements")
            sections = codec.lossless.decompress(sections)
        return codec, header, SectionReader(sections), StageCtx(header.dtype, header.shape, header.key)

    def decode(
        self, data: bytes | bytearray | memoryview, expect: Sequence[int] | None = None
    ) -> torch.Tensor:
        """The tensor a payload carries, in its original dtype and shape.

        ``expect``: the shape the receiver expects; the payload must then use this codec and hold exactly
        that shape (bytes from another peer). Without it any codec's payload decodes (local data only)."""
        shape = None if expect is None else tuple(int(d) for d in expect)
        codec, header, r, ctx = self._open(data, None if shape is None else math.prod(shape), shape)
        out = codec._decode_flat(r, header.numel, ctx)
        r.done()
        return out.to(header.dtype).reshape(header.shape)

    def _decode_flat(self, r: SectionReader, n: int, ctx: StageCtx) -> torch.Tensor:
        length, back = n, None
        if self.transform is not None:
            length, back = self.transform.inverse(r, n, ctx)
        if self.select is not None:
            pos = self.select.positions(r, length, ctx)
            vals = self.value.decode(r, pos.numel(), ctx)
            scale = getattr(self.select, "value_scale", lambda _n: None)(length)
            if scale is not None:
                vals = vals.to(torch.float32) * scale
            vec = torch.zeros(length, dtype=vals.dtype)
            vec[pos] = vals
        else:
            vec = self.value.decode(r, length, ctx)
        return back(vec.to(torch.float32)).reshape(-1) if back is not None else vec

    def decode_into(
        self,
        data: bytes | bytearray | memoryview,
        out: torch.Tensor,
        accumulate: bool = True,
        strict: bool = True,
    ) -> torch.Tensor:
        """Decode into ``out`` (same number of elements); with ``accumulate`` add to it (reductions).

        ``strict`` (the default): the payload must use this codec and hold ``out.numel()`` elements,
        checked before anything is decompressed; ``strict=False`` accepts any codec (local data)."""
        if strict:
            codec, header, r, ctx = self._open(data, out.numel(), None)
        else:
            codec, header, r, ctx = self._open(data, None, None)
            if out.numel() != header.numel:
                raise DecodeError(f"payload holds shape {header.shape}, out has shape {tuple(out.shape)}")
        n = header.numel
        fused = accumulate and out.is_contiguous() and out.device.type == "cpu" and out.dtype == torch.float32
        if fused and codec.transform is None and codec.select is None:
            codec.value.decode_add(r, n, ctx, out.view(-1))
        elif fused and codec.transform is None and codec.select is not None:
            pos = codec.select.positions(r, n, ctx)
            vals = codec.value.decode(r, pos.numel(), ctx).to(torch.float32)
            scale = getattr(codec.select, "value_scale", lambda _n: None)(n)
            out.view(-1).index_add_(0, pos, vals * scale if scale is not None else vals)
        else:
            dec = codec._decode_flat(r, n, ctx).reshape(out.shape).to(out.device)
            out.add_(dec) if accumulate else out.copy_(dec)
        r.done()
        return out

    # ---- sizes --------------------------------------------------------------------------------
    def estimate_bytes(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype = torch.float32) -> int:
        """Payload size for a tensor of this shape: exact for fixed-size chains, the target for top-k,
        and the expected ratio of the lossless stage where one is present."""
        shape = tuple(int(d) for d in shape)
        n = math.prod(shape)
        length = self.transform.vector_len(shape) if self.transform is not None else n
        body = 0
        nsec = 0
        if self.transform is not None:
            body += self.transform.meta_bytes
            nsec += 1
        k = length
        if self.select is not None:
            k = self.select.expected_k(length)
            body += self.select.index_bytes(length)
            nsec += 2 if self.select.index_bytes(length) else 0
        body += self.value.nbytes(k, dtype)
        nsec += self.value.n_sections
        if self.lossless is not None:
            body = math.ceil(body / self.lossless.expected_ratio)
        return FIXED_SIZE + 8 * len(shape) + len(self.spec) + 1 + 10 * nsec + body + CRC_SIZE
