"""The stage interfaces a codec chain is built from, and the section reader decoders walk.

A chain is ``[transform] [select] value [lossless]``:
- a transform (PowerSGD) maps the flat tensor to a shorter vector and back;
- a select stage (top-k, random-k) picks k entries and sends their positions (or none: random-k);
- exactly one value stage turns a 1-D vector into byte sections (raw, fp16, bf16, int8/4/2);
- a lossless stage (zstd) recompresses the finished sections.
Sections are appended in chain order and read back in the same order.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from potluck.compression.errors import DecodeError
from potluck.compression.spec import Param, StageSpec, canonical, resolve
from potluck.compression.wire import Section


@dataclass
class StageCtx:
    """What every stage may know about the tensor being coded."""

    dtype: torch.dtype  # of the original tensor
    shape: tuple[int, ...]
    key64: int | None
    state: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


class SectionReader:
    """Hands out a payload's (already decompressed) sections in order, checking their sizes."""

    def __init__(self, sections: list[Section]) -> None:
        self._sections = sections
        self._pos = 0

    def take(self, nbytes: int | None = None, what: str = "section") -> np.ndarray:
        if self._pos >= len(self._sections):
            raise DecodeError(f"payload has too few sections: missing {what}")
        sec = self._sections[self._pos]
        self._pos += 1
        if nbytes is not None and sec.data.nbytes != nbytes:
            raise DecodeError(f"{what}: {sec.data.nbytes} bytes where {nbytes} are expected")
        return sec.data

    def done(self) -> None:
        if self._pos != len(self._sections):
            raise DecodeError(f"payload has {len(self._sections) - self._pos} unexpected extra sections")


def tensor_from(arr: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A torch tensor over received bytes (read-only buffers are fine: we never write to them)."""
    if dtype == torch.bfloat16:
        return tensor_from(arr, torch.int16).view(torch.bfloat16)
    np_dtype = {
        torch.uint8: np.uint8,
        torch.int8: np.int8,
        torch.int16: np.int16,
        torch.int32: np.int32,
        torch.int64: np.int64,
        torch.float16: np.float16,
        torch.float32: np.float32,
        torch.float64: np.float64,
    }.get(dtype)
    if np_dtype is None:  # float8 types: via uint8
        return tensor_from(arr, torch.uint8).view(dtype)
    itemsize = np.dtype(np_dtype).itemsize
    if arr.nbytes % itemsize:
        raise DecodeError(f"section of {arr.nbytes} bytes is not a whole number of {dtype} elements")
    view = arr.view(np_dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "array is not writable": we only read it
        return torch.from_numpy(view)


class Stage(ABC):
    """A configured stage; ``PARAMS`` is its parameter schema, ``name`` its spec name."""

    KIND: ClassVar[str]
    PARAMS: ClassVar[dict[str, Param]] = {}

    def __init__(self, name: str, params: dict[str, str]) -> None:
        self.name = name
        self.p = resolve(StageSpec(name, params), self.PARAMS)

    def canonical(self) -> str:
        """Spec text with non-default parameters only (defaults are frozen per wire-format version)."""
        return canonical(self.name, {k: v for k, v in self.p.items() if v != self.PARAMS[k].default})


class ValueStage(Stage):
    """Turns a 1-D vector into sections (terminal stage of the lossy part of a chain)."""

    KIND = "value"
    n_sections: ClassVar[int] = 1

    @abstractmethod
    def encode(
        self, x: torch.Tensor, ctx: StageCtx, want_recon: bool
    ) -> tuple[list[Section], torch.Tensor | None]:
        """Encode 1-D x; return sections and (if asked) the fp32 values the decoder will see."""

    @abstractmethod
    def decode(self, r: SectionReader, n: int, ctx: StageCtx) -> torch.Tensor:
        """The 1-D decoded vector of n elements (fp32, or the original dtype for lossless raw)."""

    @abstractmethod
    def nbytes(self, n: int, dtype: torch.dtype) -> int:
        """Bytes of the sections for n elements (before any lossless stage)."""

    def decode_add(self, r: SectionReader, n: int, ctx: StageCtx, out: torch.Tensor) -> None:
        """out (1-D, contiguous) += decoded values; stages override this with a fused version."""
        out.add_(self.decode(r, n, ctx).to(out.dtype))


class SelectStage(Stage):
    """Picks k of n entries of a vector; sends their positions unless they derive from the key."""

    KIND = "select"

    @abstractmethod
    def select(self, x: torch.Tensor, ctx: StageCtx) -> tuple[list[Section], torch.Tensor]:
        """Return sections describing the positions and the int64 positions themselves (sorted)."""

    @abstractmethod
    def positions(self, r: SectionReader, n: int, ctx: StageCtx) -> torch.Tensor:
        """Read back the int64 positions (validated: sorted, unique, < n)."""

    @abstractmethod
    def expected_k(self, n: int) -> int:
        """The number of entries kept for n (the target, for estimates)."""

    @abstractmethod
    def index_bytes(self, n: int) -> int:
        """Estimated index bytes for n elements."""


class TransformStage(Stage):
    """Maps the flat tensor to a shorter vector (e.g. low-rank factors) and back."""

    KIND = "transform"
    meta_bytes: ClassVar[int] = 0

    @abstractmethod
    def forward(
        self, x: torch.Tensor, ctx: StageCtx
    ) -> tuple[list[Section], torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
        """Sections (metadata), the vector to code, and a map from the decoded vector back to n values."""

    @abstractmethod
    def inverse(
        self, r: SectionReader, n: int, ctx: StageCtx
    ) -> tuple[int, Callable[[torch.Tensor], torch.Tensor]]:
        """Length of the coded vector and the map from it back to n values."""

    @abstractmethod
    def vector_len(self, shape: tuple[int, ...]) -> int:
        """Length of the coded vector for a tensor of this shape."""


class LosslessStage(Stage):
    """Recompresses finished sections (bytes in, bytes out)."""

    KIND = "lossless"

    @abstractmethod
    def compress(self, sections: list[Section]) -> list[Section]: ...

    @abstractmethod
    def decompress(self, sections: list[Section]) -> list[Section]: ...

    expected_ratio: float = 1.0
