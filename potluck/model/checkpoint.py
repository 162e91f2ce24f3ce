"""Writing, loading and pruning per-stage checkpoints (format and verification: protocol/checkpoints.py).

Each stage of a step is written independently by each peer that holds it, into that peer's own
directory (no disk is shared), possibly at the same time as the others. Every file goes to a temporary
name in the same directory, is flushed, fsynced and renamed into place, and a stage's manifest is written
only after its weights are on disk, so a crash mid-write leaves an incomplete step that readers skip.
What a stage is (job, model, step, layers) travels as a typed ``StageMeta``. Bad arguments raise
ValueError/TypeError; problems found on disk raise CheckpointError.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from potluck.protocol.checkpoints import (
    FORMAT,
    MAX_MANIFEST_BYTES,
    VERSION,
    CheckpointRef,
    StageMeta,
    check_step,
    latest_complete,
    manifest_path,
    read_manifest,
    sha256_file,
    step_dir,
    step_dirs,
    verify_weights,
    weights_path,
)
from potluck.protocol.errors import CheckpointError

__all__ = [
    "MAX_MANIFEST_BYTES",
    "CheckpointError",
    "CheckpointRef",
    "StageMeta",
    "check_step",
    "latest_complete",
    "load_stage",
    "prune",
    "save_stage",
    "step_dir",
]

logger = logging.getLogger(__name__)


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


def save_stage(root: Path, tensors: dict[str, torch.Tensor], meta: StageMeta) -> Path:
    """Write one stage under ``root`` (weights, then manifest); returns the step directory.

    ``meta`` says which step and stage this is (``meta.step``, ``meta.stage`` of ``meta.n_stages``).
    """
    if not isinstance(tensors, dict) or not isinstance(meta, StageMeta):
        got = f"{type(tensors).__name__}, {type(meta).__name__}"
        raise TypeError(f"tensors must be a dict and meta a StageMeta, got {got}")
    bad = [
        k for k, v in tensors.items() if not isinstance(k, str) or not k or not isinstance(v, torch.Tensor)
    ]
    if bad:
        raise TypeError(f"tensors must map non-empty names to torch.Tensor; bad entries: {bad[:5]!r}")
    step, stage, n_stages = meta.step, meta.stage, meta.n_stages
    # Contiguous CPU copies: safetensors refuses views and shared storage, and the caller may keep training.
    cpu = {k: v.detach().to(device="cpu", copy=True).contiguous() for k, v in tensors.items()}
    directory = step_dir(root, step)
    directory.mkdir(parents=True, exist_ok=True)
    weights, manifest = weights_path(directory, stage), manifest_path(directory, stage)
    # A rewrite must not pair the old manifest with half-replaced weights: retract the stage first. The
    # same step written again under a new cut (a rollback, then a re-plan) retracts the old cut's stages.
    manifest.unlink(missing_ok=True)
    _retract_other_cuts(directory, step, n_stages)
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
        "meta": meta.to_dict(),
    }
    with _temp_in(directory, manifest) as tmp:
        tmp.write_bytes(json.dumps(doc, allow_nan=False).encode())
    logger.debug("saved stage %d/%d of step %d to %s (%d bytes)", stage, n_stages, step, directory, size)
    return directory


def _retract_other_cuts(directory: Path, step: int, n_stages: int) -> None:
    for path in directory.glob("stage-*.json"):
        try:
            stage = int(path.stem.removeprefix("stage-"))
            stale = read_manifest(path, step, stage).n_stages != n_stages
        except (ValueError, CheckpointError):
            stale = True  # unreadable: nobody can use it
        if stale:
            path.unlink(missing_ok=True)
            logger.info("retracted %s: written under another stage cut", path)


def load_stage(ref: CheckpointRef, stage: int) -> tuple[dict[str, torch.Tensor], StageMeta]:
    """(tensors, meta) of one stage, verified against its manifest again; CheckpointError on any damage."""
    if ref.step < 0 or ref.n_stages < 1 or not 0 <= stage < ref.n_stages:
        raise ValueError(f"stage {stage} outside [0, {ref.n_stages}) or step {ref.step} < 0")
    manifest = read_manifest(manifest_path(ref.path, stage), ref.step, stage)
    if manifest.n_stages != ref.n_stages:
        raise CheckpointError(
            f"{ref.path}: stage {stage} has {manifest.n_stages} stages, expected {ref.n_stages}"
        )
    weights = weights_path(ref.path, stage)
    before = verify_weights(weights, manifest)
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
    return tensors, manifest.meta


def prune(root: Path, keep: int, complete: bool = True) -> list[Path]:
    """Remove all but the newest ``keep`` usable steps, and incomplete steps older than the oldest kept.

    A step is usable when every stage verifies (``complete``: the job owner's copy) or, in a peer's own
    directory, which holds only the stages that peer wrote or copied (``complete=False``), when it has a
    readable stage manifest. Incomplete steps newer than the oldest kept may still be being written and
    are left alone. Returns what was removed; with fewer than ``keep`` usable steps only unusable ones
    older than all of them go.
    """
    if isinstance(keep, bool) or keep < 1:
        raise ValueError(f"keep must be >= 1 (pruning every checkpoint is never what is meant), got {keep}")
    dirs = step_dirs(root)
    kept = 0
    oldest_kept: int | None = None
    for step, directory in dirs:  # newest first: verify only until `keep` usable ones are found
        if kept == keep:
            break
        if not _usable(directory, step, complete):
            continue
        kept += 1
        oldest_kept = step
    if oldest_kept is None:
        return []
    removed: list[Path] = []
    for step, directory in dirs:
        if step < oldest_kept and _remove(directory):
            removed.append(directory)
            logger.info("pruned checkpoint %s", directory)
    return removed


def _remove(directory: Path) -> bool:
    """Remove a step directory; False when someone else (another peer pruning a directory shared in a
    test, or a second prune) got there first. The rename makes the removal look atomic to readers."""
    doomed = directory.with_name(f".{directory.name}.{os.getpid()}.pruned")
    try:
        directory.rename(doomed)
    except FileNotFoundError:
        return False
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def _usable(directory: Path, step: int, complete: bool) -> bool:
    try:
        if complete:
            check_step(directory)
            return True
        for path in directory.glob("stage-*.json"):
            with contextlib.suppress(ValueError, CheckpointError):
                read_manifest(path, step, int(path.stem.removeprefix("stage-")))
                return True
        return False
    except CheckpointError:
        return False
