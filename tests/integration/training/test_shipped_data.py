"""A job's text folder that only the job owner holds, shipped over the swarm: ``potluck launch`` builds
it into token shards (its fingerprint in the signed job), two peers in directories of their own fetch
the shards their steps read, from each other and the owner, and train to the last step. Each peer's
token file holds exactly the owner's stream; no peer holds a copy of the text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from potluck.model.corpus.manifest import decode_manifest
from tests.helpers.swarm import run_to_the_end, write_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STEPS = 30
SHARD_TOKENS = 1024  # the smallest shard: 30 steps of 64 tokens read two of them


def write_corpus(directory: Path) -> None:
    directory.mkdir(parents=True)
    for i in range(12):
        (directory / f"story-{i:02d}.txt").write_text(f"story {i}: " + "the pot boils over. " * (20 + i))
    with (directory / "more.jsonl").open("w") as f:
        for i in range(30):
            f.write(json.dumps({"text": f"line {i} of a jsonl document " * 5}) + "\n")


def test_a_folder_only_the_owner_holds_is_shipped_and_trained_on(tmp_path: Path) -> None:
    owner = tmp_path / "owner"
    write_corpus(owner / "corpus")
    job = write_job(
        owner / "job.toml",
        {"name": "shipped", "steps": STEPS, "min_peers": 2},
        model={"n_layers": 2, "d_model": 32, "n_heads": 2, "vocab_size": 256, "seq_len": 16},
        batch={"tokens_per_step": 64, "micro_batch_size": 2},
        data={"source": "directory", "path": "corpus", "shard_tokens": SHARD_TOKENS},
        checkpoint={"dir": str(owner / "ckpt"), "interval": 10},
        limits={"replicas": 2, "stages": 1},
    )
    with run_to_the_end(tmp_path, job, "ship-test", STEPS) as (swarm, text):
        assert "shipped to the peers" in text, text[-3000:]
        assert "data: corpus shipped over the swarm" in text  # what a volunteer joins, under the invite
        blobs = next((owner / "ckpt" / "corpus").glob("*/blobs"))
        manifest = decode_manifest((blobs.parent / "manifest.json").read_bytes())
        owner_stream = np.concatenate(
            [np.frombuffer((blobs / s.sha256).read_bytes(), dtype="<u2") for s in manifest.shards]
        )
        for name in ("a", "b"):
            log = swarm.procs[name].log.read_text(errors="replace")
            assert f"shipped corpus {manifest.fingerprint[:12]}" in log, log[-3000:]
            cache = next((tmp_path / "run").glob(f"**/{name}/**/corpora/{manifest.fingerprint}"), None)
            assert cache is not None, list((tmp_path / "run").rglob("corpora"))
            have = json.loads((cache / "have.json").read_text())
            # 30 steps x 4 sequences of 17 tokens: past the first 1,024-token shard, not the whole corpus
            assert 2 <= len(have) < len(manifest.shards), have
            mine = np.fromfile(cache / "tokens.bin", dtype="<u2")
            for i in have:
                at = i * SHARD_TOKENS
                span = slice(at, at + manifest.shards[i].tokens)
                assert np.array_equal(mine[span], owner_stream[span]), i
            assert not list((tmp_path / "run").glob(f"**/{name}/**/*.txt"))  # no copy of the text
