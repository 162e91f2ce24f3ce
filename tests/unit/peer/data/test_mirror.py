"""A volunteer's own copy of a shipped job's data (``--data-dir``): used when it builds to the job's
corpus, fetched over the swarm when it does not."""

from __future__ import annotations

from pathlib import Path

from potluck.model.corpus.build import prepare_corpus
from potluck.model.corpus.tokens import ShardedTokens
from potluck.model.data import ByteTokenizer
from potluck.peer.data.feed import fill_from, mirror_corpus
from potluck.protocol.jobspec import JobSpec


def write(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True)
    for i in range(5):
        (directory / f"{i}.txt").write_text(f"{text} {i} " * 300)
    return directory


def shipped_job(owner: Path) -> JobSpec:
    corpus = prepare_corpus(owner, "text", ByteTokenizer(), None, 7, owner.parent / "owner-cache", 2048)
    data = {
        "source": "directory",
        "path": "corpus",
        "fingerprint": corpus.manifest.fingerprint,
        "shard_tokens": 2048,
    }
    model = {"n_layers": 2, "d_model": 32, "n_heads": 2, "vocab_size": 256, "seq_len": 16}
    return JobSpec(
        name="j", seed=7, model=model, batch={"tokens_per_step": 64, "micro_batch_size": 2}, data=data
    )


def test_a_copy_that_builds_to_the_jobs_corpus_fills_the_token_file_without_fetching(tmp_path: Path) -> None:
    job = shipped_job(write(tmp_path / "owner" / "corpus", "the same words"))
    mine = write(tmp_path / "volunteer" / "corpus", "the same words")
    local = mirror_corpus(job, mine, None, tmp_path / "peer" / "mirrors")
    assert local is not None and local.manifest.fingerprint == job.data.fingerprint
    tokens = ShardedTokens(local.manifest, tmp_path / "peer" / "cache", seq_len=16)
    fill_from(tokens, local)
    assert tokens.needed(0, 10_000, 4) == []  # every shard here: nothing to fetch


def test_a_copy_that_differs_is_not_used(tmp_path: Path, caplog) -> None:
    job = shipped_job(write(tmp_path / "owner" / "corpus", "the same words"))
    mine = write(tmp_path / "volunteer" / "corpus", "other words")
    assert mirror_corpus(job, mine, None, tmp_path / "peer" / "mirrors") is None
    assert "differs from the job's data" in caplog.text
    assert mirror_corpus(job, tmp_path / "nowhere", None, tmp_path / "peer" / "mirrors") is None
    assert "is not used" in caplog.text
