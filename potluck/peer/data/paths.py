"""Where a peer reads a job's data: on its owner's terms, never at a path the job chooses.

A signed job is the coordinator's word on *what* to train, not a licence to read this machine's files.
The paths a job names (``data.path``, ``data.tokenizer``) are therefore read as names under the peer's
own ``<state_dir>/data/`` (no absolute paths, no ``..``), unless the volunteer passed the place on the
command line (``--data-dir``, ``--tokenizer``), which always wins. Checkpoints already live under the
peer's state directory (``WorkerConfig.checkpoints``), whatever ``checkpoint.dir`` says.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from potluck.peer.errors import PeerError
from potluck.protocol.jobspec import DataSpec


class DataPathError(PeerError):
    """The job names a data path this peer will not read."""


def local_data(spec: DataSpec, state_dir: Path, data_dir: Path | None, tokenizer: Path | None) -> DataSpec:
    """``spec`` with its paths as this machine reads them (see the module doc), or ``DataPathError``."""
    path = spec.path
    if spec.source == "directory":
        path = str(data_dir) if data_dir is not None else str(_inside(state_dir, spec.path, "data.path"))
    tok = spec.tokenizer
    if tokenizer is not None:
        tok = str(tokenizer)
    elif tok is not None:
        tok = str(_inside(state_dir, tok, "data.tokenizer"))
    return spec.model_copy(update={"path": path, "tokenizer": tok})


def _inside(state_dir: Path, name: str | None, what: str) -> Path:
    root = state_dir / "data"
    where = "--data-dir DIR" if what == "data.path" else "--tokenizer FILE"
    if not name:
        raise DataPathError(f"the job reads a directory of text but names none; pass {where}")
    rel = PurePosixPath(name.replace("\\", "/"))
    if rel.is_absolute() or ".." in rel.parts or name.startswith("~"):
        raise DataPathError(
            f"the job's {what} is {name!r}: a peer reads no path a job chooses. Put your copy of it under "
            f"{root}/ and have the job name it relatively, or pass {where}"
        )
    return root / rel
