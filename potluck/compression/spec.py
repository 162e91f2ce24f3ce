"""Codec spec strings: ``stage[:key=value,...]`` joined by ``|``.

Example: ``topk:density=0.01|int4:block=64|zstd``.

Parsing is strict (unknown stages or parameters are errors) because the canonical spec also travels in
every payload header, where a decoder must refuse what it does not understand.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from potluck.compression.errors import SpecError

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_VALUE = re.compile(r"^[A-Za-z0-9_.+\-]+$")


@dataclass(frozen=True)
class StageSpec:
    name: str
    params: dict[str, str]


def parse(spec: str) -> list[StageSpec]:
    """Split a spec string into stages with raw string parameters."""
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError("empty codec spec; try 'none', 'fp16' or 'int8:block=64'")
    stages = []
    for part in spec.strip().split("|"):
        part = part.strip()
        name, _, rest = part.partition(":")
        name = name.strip().lower()
        if not _NAME.match(name):
            raise SpecError(f"bad stage name {name!r} in spec {spec!r}")
        params: dict[str, str] = {}
        if rest.strip():
            for item in rest.split(","):
                k, eq, v = item.partition("=")
                k, v = k.strip().lower(), v.strip()
                if not eq or not _NAME.match(k) or not _VALUE.match(v):
                    raise SpecError(f"bad parameter {item!r} in stage {name!r} (want key=value)")
                if k in params:
                    raise SpecError(f"parameter {k!r} given twice in stage {name!r}")
                params[k] = v
        stages.append(StageSpec(name, params))
    return stages


@dataclass(frozen=True)
class Param:
    """One parameter of a stage: a converter, a default and a check that returns an error or None."""

    convert: Callable[[str], Any]
    default: Any
    check: Callable[[Any], str | None] = lambda _v: None


def parse_bool(v: str) -> bool:
    if v.lower() in ("1", "true", "yes", "on"):
        return True
    if v.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {v!r}")


def resolve(stage: StageSpec, schema: dict[str, Param]) -> dict[str, Any]:
    """Typed parameters with defaults filled in; raises SpecError on anything unknown or invalid."""
    unknown = set(stage.params) - set(schema)
    if unknown:
        raise SpecError(
            f"stage {stage.name!r} has no parameter(s) {sorted(unknown)}; known: {sorted(schema)}"
        )
    out: dict[str, Any] = {}
    for key, p in schema.items():
        if key in stage.params:
            try:
                val = p.convert(stage.params[key])
            except (ValueError, TypeError) as exc:
                raise SpecError(f"{stage.name}:{key}={stage.params[key]!r}: {exc}") from exc
        else:
            val = p.default
        problem = p.check(val)
        if problem:
            raise SpecError(f"{stage.name}:{key}={val!r}: {problem}")
        out[key] = val
    return out


def format_value(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def canonical(name: str, params: dict[str, Any]) -> str:
    if not params:
        return name
    return name + ":" + ",".join(f"{k}={format_value(params[k])}" for k in sorted(params))
