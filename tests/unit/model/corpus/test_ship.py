"""What launch does with a job's data: the model's own tokenizer by default, a directory source built
and fingerprinted into the signed job, and the refusals a job owner sees before anything is signed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from potluck.model.corpus.ship import job_tokenizer, keep_tokenizer, ship_data
from potluck.model.errors import DataError
from potluck.protocol.jobspec import JobSpec
from tests.helpers.bpe import train_bpe

MODEL = {"n_layers": 2, "d_model": 32, "n_heads": 2, "vocab_size": 512, "seq_len": 16}
BATCH = {"tokens_per_step": 64, "micro_batch_size": 2}


def job(**data: object) -> JobSpec:
    return JobSpec(name="j", model=MODEL, batch=BATCH, data=data)


def test_a_directory_is_built_and_its_fingerprint_signed(tmp_path: Path) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("some text " * 100)
    shipped, corpus = ship_data(job(source="directory", path="corpus"), tmp_path, tmp_path / "cache")
    assert corpus is not None and shipped.data.fingerprint == corpus.manifest.fingerprint
    assert shipped.data.tokens == corpus.manifest.tokens == 1001  # 1,000 bytes and the end of text
    same, nothing = ship_data(job(), tmp_path, tmp_path / "cache")  # generated: nothing to ship
    assert nothing is None and same.data.fingerprint is None
    with pytest.raises(DataError, match="is absolute"):
        ship_data(job(source="directory", path=str(tmp_path / "corpus")), tmp_path, tmp_path / "cache")


def test_the_models_tokenizer_is_the_default_and_its_size_is_checked(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    tokenizer = train_bpe(tmp_path / "m")  # m/tokenizer.json, about 300 tokens
    hf = JobSpec(name="j", model={**MODEL, "from": "m", "family": "llama"}, batch=BATCH)
    named = job_tokenizer(hf, tmp_path)
    assert named.data.tokenizer == "m/tokenizer.json"
    assert job_tokenizer(job(), tmp_path).data.tokenizer is None  # a native job: bytes
    keep_tokenizer(named, tmp_path, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "tokenizer.json").read_bytes() == tokenizer.read_bytes()
    small = named.model_copy(update={"model": named.model.model_copy(update={"vocab_size": 256})})
    with pytest.raises(DataError, match=r"tokenizer has \d+ tokens but model.vocab_size is 256"):
        ship_data(small, tmp_path, tmp_path / "cache")
    shutil.rmtree(tmp_path / "m")
    with pytest.raises(DataError, match="does not exist"):
        ship_data(named, tmp_path, tmp_path / "cache")
