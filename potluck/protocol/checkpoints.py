"""The on-disk checkpoint format, shared by the peers that write it and the coordinator that resumes.

Layout under a root directory::

    root/step-00000120/stage-000.safetensors   the stage's tensors
    root/step-00000120/stage-000.json          manifest: step, stage, n_stages, size + sha256 of the
                                               weights file, and the writer's JSON ``meta``

A stage counts only when its manifest exists and the weights file matches it (size and SHA-256); a step
counts only when every stage does. Readers skip damaged or incomplete steps and fall back to the previous
complete one. Writing (which needs torch) lives in ``potluck.model.checkpoint``; everything here is
plain files and hashes, so the coordinator can find the resume point without loading a tensor.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from potluck.protocol.errors import CheckpointError

logger = logging.getLogger(__name__)

FORMAT = "potluck-stage-checkpoint"
VERSION = 1
MAX_MANIFEST_BYTES = 1 << 20  # 1 MiB: a manifest is a few hundred bytes plus the caller's meta
HASH_CHUNK_BYTES = 1 << 20  # read size while hashing weights files
_STEP_DIR = re.compile(r"step-(\d{8,})")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class CheckpointRef:
    """A complete checkpoint: every stage of ``step`` verified under ``root``."""

    root: Path
    step: int
    n_stages: int

    @property
    def path(self) -> Path:
        return step_dir(self.root, self.step)


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def weights_path(directory: Path, stage: int) -> Path:
    return directory / f"stage-{stage:03d}.safetensors"


def manifest_path(directory: Path, stage: int) -> Path:
    return directory / f"stage-{stage:03d}.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(path: Path, step: int, stage: int) -> dict[str, Any]:
    """The parsed manifest of ``stage`` at ``step``, or CheckpointError saying what is wrong with it."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)  # never parse (or even read) an oversized file
    except FileNotFoundError:
        raise CheckpointError(f"{path}: manifest missing") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read manifest: {e}") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise CheckpointError(f"{path}: manifest larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: manifest is not valid JSON: {e}") from None
    weights = doc.get("weights") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(weights, dict):
        raise CheckpointError(f"{path}: not a {FORMAT} manifest")
    if doc.get("version") != VERSION:
        raise CheckpointError(f"{path}: manifest version {doc.get('version')!r}, expected {VERSION}")
    n_stages = doc.get("n_stages")
    if (
        (doc.get("step"), doc.get("stage")) != (step, stage)
        or not isinstance(n_stages, int)
        or stage >= n_stages
    ):
        raise CheckpointError(
            f"{path}: manifest says step {doc.get('step')!r} stage {doc.get('stage')!r} of "
            f"{n_stages!r}, expected step {step} stage {stage}"
        )
    size, sha = weights.get("size"), weights.get("sha256")
    if not isinstance(size, int) or size < 0 or not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise CheckpointError(f"{path}: manifest has no valid weights size and sha256")
    if weights.get("file") != weights_path(path.parent, stage).name or not isinstance(doc.get("meta"), dict):
        raise CheckpointError(f"{path}: manifest names the wrong weights file or has no meta object")
    return doc


def verify_weights(path: Path, doc: dict[str, Any]) -> os.stat_result:
    """Check the weights file against its manifest; returns its stat (to detect a later replacement)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: weights file missing") from None
    expected = doc["weights"]
    if st.st_size != expected["size"]:
        raise CheckpointError(f"{path}: {st.st_size} bytes, manifest says {expected['size']} (truncated?)")
    if sha256_file(path) != expected["sha256"]:
        raise CheckpointError(f"{path}: sha256 does not match the manifest (corrupted)")
    return st


def parse_step(directory: Path) -> int | None:
    match = _STEP_DIR.fullmatch(directory.name)
    if match is None or f"step-{int(match.group(1)):08d}" != directory.name:
        return None
    return int(match.group(1))


def check_step(directory: Path, n_stages: int | None = None) -> CheckpointRef:
    """Verify every stage of one step directory; CheckpointError names the first problem found.

    With ``n_stages`` None the count is taken from the manifests, which must all agree.
    """
    directory = Path(directory)
    step = parse_step(directory)
    if step is None or not directory.is_dir():
        raise CheckpointError(f"{directory}: not a step-NNNNNNNN checkpoint directory")
    if n_stages is None:
        counts = set()
        for p in directory.glob("stage-*.json"):
            stage_match = re.fullmatch(r"stage-(\d{3,})\.json", p.name)
            if stage_match:
                counts.add(read_manifest(p, step, int(stage_match.group(1)))["n_stages"])
        if not counts:
            raise CheckpointError(f"{directory}: no stage manifests (incomplete)")
        if len(counts) > 1:
            raise CheckpointError(f"{directory}: manifests disagree on n_stages: {sorted(counts)}")
        n_stages = counts.pop()
    elif n_stages < 1:
        raise ValueError(f"n_stages must be >= 1, got {n_stages}")
    for stage in range(n_stages):
        path = manifest_path(directory, stage)
        doc = read_manifest(path, step, stage)
        if doc["n_stages"] != n_stages:
            raise CheckpointError(f"{path}: manifest says {doc['n_stages']} stages, expected {n_stages}")
        verify_weights(weights_path(directory, stage), doc)
    return CheckpointRef(directory.parent, step, n_stages)


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """(step, directory) under ``root``, newest first; other names (temp files, notes) are ignored."""
    if not Path(root).is_dir():
        return []
    found = [(step, p) for p in Path(root).iterdir() if (step := parse_step(p)) is not None and p.is_dir()]
    return sorted(found, reverse=True)


def latest_complete(root: Path, n_stages: int | None = None) -> CheckpointRef | None:
    """The newest step under ``root`` whose every stage verifies; damaged steps are logged and skipped."""
    for _, directory in step_dirs(root):
        try:
            return check_step(directory, n_stages)
        except CheckpointError as e:
            logger.warning("skipping checkpoint %s: %s", directory.name, e)
    return None


def prune(root: Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` complete steps, and incomplete steps older than the oldest kept.

    Incomplete steps newer than that may still be being written and are left alone. Returns what was
    removed; with fewer than ``keep`` complete steps only incomplete ones older than all of them go.
    """
    if isinstance(keep, bool) or keep < 1:
        raise ValueError(f"keep must be >= 1 (pruning every checkpoint is never what is meant), got {keep}")
    dirs = step_dirs(root)
    kept = 0
    oldest_kept: int | None = None
    for step, directory in dirs:  # newest first: verify only until `keep` complete ones are found
        if kept == keep:
            break
        try:
            check_step(directory)
        except CheckpointError:
            continue
        kept += 1
        oldest_kept = step
    if oldest_kept is None:
        return []
    removed: list[Path] = []
    for step, directory in dirs:
        if step < oldest_kept:
            shutil.rmtree(directory)
            removed.append(directory)
            logger.info("pruned checkpoint %s", directory)
    return removed
