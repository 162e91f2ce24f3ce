"""Reading a job file (TOML) into a ``JobSpec``, with errors that name the offending field."""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import ValidationError

from potluck.protocol.errors import JobSpecError
from potluck.protocol.jobspec import JobSpec

MAX_JOB_FILE_BYTES = 1 << 20


def load_job(path: Path) -> JobSpec:
    """Parse and validate ``path``; raise ``JobSpecError`` naming the file and field on any problem."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise JobSpecError(f"cannot read job file {path}: {e.strerror}") from None
    if len(raw) > MAX_JOB_FILE_BYTES:
        raise JobSpecError(f"job file {path} is larger than {MAX_JOB_FILE_BYTES} bytes")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise JobSpecError(f"job file {path} is not valid TOML: {e}") from None
    return parse_job(data, source=str(path))


def parse_job(data: dict[str, object], source: str = "job") -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"{source}: field `{where}`: {err['msg']}")
        raise JobSpecError("\n".join(lines)) from None
