"""What ``potluck launch`` does with a job's data before signing it: a directory source of a pipeline job
is built into a shipped corpus (``build.py``) and the job carries its fingerprint, so peers fetch it
over the swarm instead of each keeping a copy. Paths are the job owner's: relative to the job file."""

from __future__ import annotations

import shutil
from pathlib import Path

from potluck.model.corpus.build import Corpus, prepare_corpus
from potluck.model.data import load_tokenizer
from potluck.model.errors import DataError
from potluck.model.sampling import CHECKPOINT_TOKENIZER
from potluck.protocol.jobspec import JobSpec, owner_path

MODEL_TOKENIZER = "tokenizer.json"  # a Hugging Face model directory's tokenizer


def job_tokenizer(job: JobSpec, job_dir: Path) -> JobSpec:
    """``job`` naming its model's tokenizer when it names none: a job ``from`` a Hugging Face directory
    holding ``tokenizer.json`` encodes its data with it (as the model was trained)."""
    if job.data.tokenizer is not None or job.model.from_dir is None:
        return job
    candidate = Path(job.model.from_dir) / MODEL_TOKENIZER
    if not owner_path(job_dir, str(candidate)).is_file():
        return job
    return job.model_copy(update={"data": job.data.model_copy(update={"tokenizer": str(candidate)})})


def ship_data(job: JobSpec, job_dir: Path, cache: Path) -> tuple[JobSpec, Corpus | None]:
    """``job`` with ``data.fingerprint`` set and its corpus, for a directory source of a pipeline job
    (else ``job`` as it is and None). DataError naming what is missing or does not fit the model."""
    spec = job.data
    if job.kind != "pipeline":  # a class-parallel job's images: each volunteer's checked copy
        return job, None
    tokenizer_file = owner_path(job_dir, spec.tokenizer) if spec.tokenizer is not None else None
    tokenizer = load_tokenizer(str(tokenizer_file) if tokenizer_file is not None else None)
    if tokenizer.vocab_size > job.model.vocab_size:
        raise DataError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size is {job.model.vocab_size}"
        )
    if spec.source != "directory":
        return job, None
    assert spec.path is not None  # DataSpec requires it for a directory source
    if Path(spec.path).is_absolute():
        raise DataError(
            f"data.path {spec.path!r} is absolute: name it relative to the job file, so the job means the "
            "same on any machine it is launched from"
        )
    directory = owner_path(job_dir, spec.path)
    corpus = prepare_corpus(
        directory, spec.text_field, tokenizer, tokenizer_file, job.seed, cache, spec.shard_tokens
    )
    data = spec.model_copy(
        update={"fingerprint": corpus.manifest.fingerprint, "tokens": corpus.manifest.tokens}
    )
    return job.model_copy(update={"data": data}), corpus


def keep_tokenizer(job: JobSpec, job_dir: Path, root: Path) -> None:
    """A copy of the job's tokenizer in its checkpoint directory ``root`` (the owner's copy), where
    ``potluck generate`` and ``potluck export`` look for it (model/sampling.py)."""
    if job.data.tokenizer is None or job.kind != "pipeline":
        return
    source = owner_path(job_dir, job.data.tokenizer)
    root.mkdir(parents=True, exist_ok=True)
    target = root / CHECKPOINT_TOKENIZER
    if not target.is_file() or target.read_bytes() != source.read_bytes():
        shutil.copyfile(source, target)
