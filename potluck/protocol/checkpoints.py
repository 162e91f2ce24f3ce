"""The on-disk checkpoint format, shared by the peers that write it and the coordinator that resumes.

Layout under a root directory::

    root/step-00000120/stage-000.safetensors   the stage's tensors
    root/step-00000120/stage-000.json          manifest: step, stage, n_stages, size + sha256 of the
                                               weights file, and the stage's ``StageMeta``

A stage counts only when its manifest exists, its ``StageMeta`` validates and agrees with it, and the
weights file matches it (size and SHA-256); a step counts only when every stage does. Readers skip damaged
or incomplete steps and fall back to the previous complete one. Writing and pruning (which change files;
writing needs torch) live in ``potluck.model.checkpoint``; everything here only reads plain files and
hashes, so the coordinator can find the resume point without loading a tensor.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from potluck.protocol.errors import CheckpointError
from potluck.protocol.jobspec import JobSpec, ModelSpec
from potluck.protocol.records import Name
from potluck.protocol.training import TrainPlan

logger = logging.getLogger(__name__)

FORMAT = "potluck-stage-checkpoint"
VERSION = 1
MAX_MANIFEST_BYTES = 1 << 20  # 1 MiB: a manifest is well under 4 KiB; anything larger is not ours
HASH_CHUNK_BYTES = 1 << 20  # read size while hashing weights files
_STEP_DIR = re.compile(r"step-(\d{8,})")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class StageMeta(BaseModel):
    """What one stage's checkpoint holds, beside its tensors: written by the trainer, checked by every
    reader (sampling, resume, the coordinator's resume decision) before a tensor is used.

    Frozen and strict: unknown, missing or ill-typed fields are refused (``from_dict`` names them), so a
    new field is a new manifest ``VERSION``. Constructed in code, bad values raise ValueError.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    job: Name  # JobSpec.name
    step: int = Field(ge=0, le=10**9)  # steps completed when it was written (JobSpec.steps bounds it)
    stage: int = Field(lt=1024)  # pipeline position under the plan that wrote it; >= 0 checked below
    n_stages: int = Field(ge=1, le=1024)
    first_layer: int = Field(ge=0, lt=1024)  # the stage holds layers [first_layer, last_layer)
    last_layer: int = Field(ge=1, le=1024)
    model: ModelSpec
    seed: int = Field(ge=0, lt=2**63)  # JobSpec.seed: the init and data order
    tokenizer: str | None = Field(max_length=1024)  # DataSpec.tokenizer; None: bytes
    epoch: int = Field(ge=0, lt=2**27)  # the plan epoch that wrote it

    @model_validator(mode="after")
    def _consistent(self) -> StageMeta:
        if not 0 <= self.stage < self.n_stages:
            raise ValueError(f"stage {self.stage} outside [0, {self.n_stages})")
        if not self.first_layer < self.last_layer <= self.model.n_layers:
            raise ValueError(
                f"layers [{self.first_layer}, {self.last_layer}) outside [0, {self.model.n_layers})"
            )
        return self

    @classmethod
    def from_dict(cls, raw: object, where: str) -> StageMeta:
        """Validate a manifest's ``meta`` object; CheckpointError naming ``where`` and each bad field."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"{where}: meta is not an object")
        try:
            return cls.model_validate(raw, strict=True)  # strict reaches the nested ModelSpec too
        except ValidationError as e:
            missing = [".".join(map(str, err["loc"])) for err in e.errors() if err["type"] == "missing"]
            faults = [f"meta lacks {missing}"] if missing else []
            faults += [
                f"meta field `{'.'.join(map(str, err['loc'])) or '(object)'}`: {err['msg']}"
                for err in e.errors()
                if err["type"] != "missing"
            ]
            raise CheckpointError(f"{where}: {'; '.join(faults)}") from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object a manifest stores (``from_dict`` reads it back equal)."""
        return self.model_dump(mode="json")


def plan_stage_meta(job: JobSpec, plan: TrainPlan, stage: int, step: int) -> StageMeta:
    """What stage ``stage`` of ``plan`` is after ``step`` steps: the meta its checkpoints and copies carry
    (written by its replicas, its copy holder and the job owner alike, so all of them agree)."""
    a = plan.stages[stage]
    return StageMeta(
        job=job.name,
        step=step,
        stage=stage,
        n_stages=len(plan.stages),
        first_layer=a.first_layer,
        last_layer=a.last_layer,
        model=job.model,
        seed=job.seed,
        tokenizer=job.data.tokenizer,
        epoch=plan.epoch,
    )


@dataclass(frozen=True)
class Manifest:
    """One stage's verified manifest: where its weights are, what they hash to, and its meta."""

    step: int
    stage: int
    n_stages: int
    weights_file: str  # the file name, inside the step directory
    size: int  # bytes
    sha256: str  # hex
    meta: StageMeta


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


def read_manifest(path: Path, step: int, stage: int) -> Manifest:
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
    meta = StageMeta.from_dict(doc["meta"], str(path))
    if (meta.step, meta.stage, meta.n_stages) != (step, stage, n_stages):
        raise CheckpointError(
            f"{path}: meta says step {meta.step} stage {meta.stage} of {meta.n_stages}, the manifest "
            f"step {step} stage {stage} of {n_stages}"
        )
    return Manifest(step, stage, n_stages, weights["file"], size, sha, meta)


def verify_weights(path: Path, manifest: Manifest) -> os.stat_result:
    """Check the weights file against its manifest; returns its stat (to detect a later replacement)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: weights file missing") from None
    if st.st_size != manifest.size:
        raise CheckpointError(f"{path}: {st.st_size} bytes, manifest says {manifest.size} (truncated?)")
    if sha256_file(path) != manifest.sha256:
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
                counts.add(read_manifest(p, step, int(stage_match.group(1))).n_stages)
        if not counts:
            raise CheckpointError(f"{directory}: no stage manifests (incomplete)")
        if len(counts) > 1:
            raise CheckpointError(f"{directory}: manifests disagree on n_stages: {sorted(counts)}")
        n_stages = counts.pop()
    elif n_stages < 1:
        raise ValueError(f"n_stages must be >= 1, got {n_stages}")
    for stage in range(n_stages):
        path = manifest_path(directory, stage)
        manifest = read_manifest(path, step, stage)
        if manifest.n_stages != n_stages:
            raise CheckpointError(f"{path}: manifest says {manifest.n_stages} stages, expected {n_stages}")
        verify_weights(weights_path(directory, stage), manifest)
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
