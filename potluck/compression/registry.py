"""Stage names -> classes, ``get_codec(spec)`` and the module-level ``decode`` for any payload."""

from __future__ import annotations

from functools import lru_cache

import torch

from potluck.compression.base import Codec
from potluck.compression.errors import DecodeError, SpecError
from potluck.compression.spec import parse
from potluck.compression.stages.base import LosslessStage, SelectStage, Stage, TransformStage, ValueStage
from potluck.compression.stages.cast import Bf16Stage, Fp16Stage, RawStage
from potluck.compression.stages.lossless import ZstdStage
from potluck.compression.stages.lowrank import PowerSGDStage
from potluck.compression.stages.quantize import QuantStage
from potluck.compression.stages.signmag import SignMagStage
from potluck.compression.stages.sparsify import RandKStage, TopKStage
from potluck.compression.wire import MAX_ELEMENTS

STAGES: dict[str, type[Stage]] = {
    "none": RawStage,
    "fp32": RawStage,
    "fp16": Fp16Stage,
    "bf16": Bf16Stage,
    "int8": QuantStage,
    "int4": QuantStage,
    "int2": QuantStage,
    "signmag": SignMagStage,
    "topk": TopKStage,
    "randk": RandKStage,
    "powersgd": PowerSGDStage,
    "zstd": ZstdStage,
}
_ORDER = (TransformStage, SelectStage, ValueStage, LosslessStage)


def build_stages(spec: str) -> list[Stage]:
    stages: list[Stage] = []
    for st in parse(spec):
        cls = STAGES.get(st.name)
        if cls is None:
            raise SpecError(f"unknown codec stage {st.name!r}; known: {sorted(STAGES)}")
        stages.append(cls(st.name, st.params))
    ranks = [next(i for i, base in enumerate(_ORDER) if isinstance(s, base)) for s in stages]
    if ranks != sorted(ranks) or len(set(ranks)) != len(ranks):
        raise SpecError(
            f"bad stage order in {spec!r}: "
            "use [powersgd] [topk|randk] [none|fp32|fp16|bf16|int8|int4|int2|signmag] [zstd]"
        )
    if not any(isinstance(s, ValueStage) for s in stages):
        stages.insert(sum(r < 2 for r in ranks), RawStage("none", {}))
    return stages


@lru_cache(maxsize=512)
def get_codec(spec: str, nonfinite: str = "error", max_elements: int = MAX_ELEMENTS) -> Codec:
    """The codec for a spec such as ``"int8:block=64"`` or ``"topk:density=0.01|int4|zstd"``.

    ``nonfinite="zero"`` sends NaN/Inf as 0 instead of raising NonFiniteError. Codecs are immutable
    and cached; error feedback and caches live in the ``state`` the caller passes to ``encode``.
    """
    return Codec(build_stages(spec), _from_header, nonfinite, max_elements)


def _from_header(spec: str) -> Codec:
    try:
        return get_codec(spec)
    except SpecError as exc:
        raise DecodeError(f"payload names a codec this build cannot decode: {exc}") from exc


def decode(data: bytes | bytearray | memoryview, max_elements: int = MAX_ELEMENTS) -> torch.Tensor:
    """Decode any payload (it names its own codec)."""
    return get_codec("none", max_elements=max_elements).decode(data)


def decode_into(
    data: bytes | bytearray | memoryview, out: torch.Tensor, accumulate: bool = True
) -> torch.Tensor:
    """Decode a payload of any codec into ``out`` (local data: a payload from another peer goes through
    its link's codec, ``Codec.decode_into``, which checks the codec and size before decompressing)."""
    return get_codec("none").decode_into(data, out, accumulate, strict=False)
