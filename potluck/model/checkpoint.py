"""Writing and loading per-stage checkpoints (the format and its verification: protocol/checkpoints.py).

Each stage of a step is written independently by its replica-0 peer, possibly at the same time as the
others. Every file goes to a temporary name in the same directory, is flushed, fsynced and renamed into
place, and a stage's manifest is written only after its weights are on disk, so a crash mid-write leaves
an incomplete step that readers skip. Bad arguments raise ValueError/TypeError; problems found on disk
raise CheckpointError.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from potluck.protocol.checkpoints import (
    FORMAT,
    MAX_MANIFEST_BYTES,
    VERSION,
    CheckpointRef,
    check_step,
    latest_complete,
    manifest_path,
    prune,
    read_manifest,
    sha256_file,
    step_dir,
    verify_weights,
    weights_path,
)
from potluck.protocol.errors import CheckpointError

__all__ = ["CheckpointError", "CheckpointRef", "check_step", "latest_complete", "load_stage", "prune",
           "save_stage", "step_dir"]  # fmt: skip

logger = logging.getLogger(__name__)

MAX_META_BYTES = MAX_MANIFEST_BYTES - 4096  # leaves room for the manifest's own fields


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; some platforms cannot open a directory, where this is best effort.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _temp_in(directory: Path, final: Path) -> Iterator[Path]:
    """A temporary path next to ``final``, renamed onto it on success and removed on failure."""
    fd, name = tempfile.mkstemp(dir=directory, prefix=f".{final.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; checkpoints are shared with the other stages' peers
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(directory)
    finally:
        tmp.unlink(missing_ok=True)


def _check_stage_args(step: int, stage: int, n_stages: int) -> None:
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if n_stages < 1:
        raise ValueError(f"n_stages must be >= 1, got {n_stages}")
    if not 0 <= stage < n_stages:
        raise ValueError(f"stage {stage} outside [0, {n_stages})")


def save_stage(
    root: Path, step: int, stage: int, n_stages: int, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> Path:
    """Write one stage of ``step`` under ``root`` (weights, then manifest); returns the step directory."""
    _check_stage_args(step, stage, n_stages)
    if not isinstance(tensors, dict) or not isinstance(meta, dict):
        raise TypeError(
            f"tensors and meta must be dicts, got {type(tensors).__name__}, {type(meta).__name__}"
        )
    bad = [
        k for k, v in tensors.items() if not isinstance(k, str) or not k or not isinstance(v, torch.Tensor)
    ]
    if bad:
        raise TypeError(f"tensors must map non-empty names to torch.Tensor; bad entries: {bad[:5]!r}")
    try:  # before touching the disk, so bad meta never retracts a stage that was already saved
        meta_bytes = len(json.dumps(meta, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError(f"meta is not JSON-serialisable: {e}") from None
    if meta_bytes > MAX_META_BYTES:
        raise ValueError(f"meta is {meta_bytes} bytes of JSON, over the {MAX_META_BYTES} byte cap")
    # Contiguous CPU copies: safetensors refuses views and shared storage, and the caller may keep training.
    cpu = {k: v.detach().to(device="cpu", copy=True).contiguous() for k, v in tensors.items()}
    directory = step_dir(root, step)
    directory.mkdir(parents=True, exist_ok=True)
    weights, manifest = weights_path(directory, stage), manifest_path(directory, stage)
    # A rewrite must not pair the old manifest with half-replaced weights: retract the stage first.
    manifest.unlink(missing_ok=True)
    with _temp_in(directory, weights) as tmp:
        save_file(cpu, str(tmp))
        size, sha = tmp.stat().st_size, sha256_file(tmp)
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "step": step,
        "stage": stage,
        "n_stages": n_stages,
        "weights": {"file": weights.name, "size": size, "sha256": sha},
        "meta": meta,
    }
    with _temp_in(directory, manifest) as tmp:
        tmp.write_bytes(json.dumps(doc, allow_nan=False).encode())  # same encoding as the size check
    logger.debug("saved stage %d/%d of step %d to %s (%d bytes)", stage, n_stages, step, directory, size)
    return directory


def load_stage(ref: CheckpointRef, stage: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, meta) of one stage, verified against its manifest again; CheckpointError on any damage."""
    _check_stage_args(ref.step, stage, ref.n_stages)
    doc = read_manifest(manifest_path(ref.path, stage), ref.step, stage)
    if doc["n_stages"] != ref.n_stages:
        raise CheckpointError(
            f"{ref.path}: stage {stage} has {doc['n_stages']} stages, expected {ref.n_stages}"
        )
    weights = weights_path(ref.path, stage)
    before = verify_weights(weights, doc)
    try:
        tensors = load_file(str(weights), device="cpu")
        after = weights.stat()
    except (OSError, SafetensorError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{weights}: cannot load: {e}") from None
    if (before.st_ino, before.st_size, before.st_mtime_ns) != (
        after.st_ino,
        after.st_size,
        after.st_mtime_ns,
    ):
        raise CheckpointError(f"{weights}: replaced while loading; retry")
    return tensors, doc["meta"]
