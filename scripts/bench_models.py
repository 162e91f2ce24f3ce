#!/usr/bin/env python
"""A Hugging Face model and a text folder only the job owner holds, trained by a 2 x 2 swarm (issue 35).

A Llama of about 125M parameters (random weights, written as a Hugging Face directory by
``transformers``) and a folder of text sit beside the job file; ``potluck launch`` converts the model
into step 0 and ships the data; four peers (`potluck peer`, each with its own --state-dir) pull their
stages' layers and the shards their steps read, and train a few steps on 127.0.0.1. Then ``potluck
export`` of the final checkpoint is loaded with ``transformers``.

    .venv/bin/python scripts/bench_models.py --json           # ~125M: d 768, 12 layers, vocab 32000
    .venv/bin/python scripts/bench_models.py --small --json   # d 256, 4 layers: a quick smoke run

Reported (the last line with --json is one JSON object):
- ``load_rss_ratio``: per peer, the most its resident memory grew from just before the plan placed it
  until it held its stage's state (its log's "resumed at step 0"), over its stage's share of the
  weights (the fp32 bytes it fetched: at step 0 a stage's state is its weights); the worst peer.
  Target <= 1.3.
- ``first_step_s``: from the plan's publication to the first committed step (model and data fetch,
  start barrier, the step itself).
- ``data_tokens_per_s_ratio``: the slower of the owner's corpus build (tokens/s, read from its log; the
  corpus encoded with a byte-level BPE tokenizer of 8,192 tokens learned on it and saved as the model's
  ``tokenizer.json``) and a peer's reads of sequences from its token file, over the tokens/s training
  consumed. Target >= 20.
- ``export_s``: ``potluck export`` plus ``AutoModelForCausalLM.from_pretrained`` of the result.
Sampling: each peer's RSS every 0.1 s (psutil); times from this process's clock as log lines appear.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's potluck

from potluck.testbed.localswarm import LocalSwarm
from tests.helpers.swarm import start_on_own_disks, write_job

PEERS = ("a", "b", "c", "d")


def make_model(directory: Path, small: bool) -> int:
    import torch
    import transformers

    shape = (
        dict(
            hidden_size=256,
            intermediate_size=704,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        if small
        else dict(
            hidden_size=768,
            intermediate_size=2048,
            num_hidden_layers=12,
            num_attention_heads=12,
            num_key_value_heads=4,
        )
    )
    config = transformers.LlamaConfig(
        vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=False, **shape
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def make_tokenizer(model: Path, corpus: Path, vocab: int = 8192) -> None:
    """A byte-level BPE tokenizer learned on the corpus, saved as the model's ``tokenizer.json`` (the
    job then encodes its data with it, as with a real model's tokenizer)."""
    import tokenizers as tk

    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tok.train([str(f) for f in sorted(corpus.glob("*.txt"))[:2]], trainer=trainer)
    tok.save(str(model / "tokenizer.json"))


def make_corpus(directory: Path, mb: float) -> None:
    from potluck.model.data import generated_corpus

    directory.mkdir(parents=True)
    per_file = 1_000_000
    for i in range(max(1, int(mb * 1e6 / per_file))):
        (directory / f"part-{i:03d}.txt").write_text(generated_corpus(per_file, seed=i))


class RssWatch(threading.Thread):
    """Every peer's RSS (its process and children: the p2pd daemon excluded, it is a separate binary
    whose memory is the transport's), sampled every 0.1 s with this process's clock."""

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.samples: dict[str, list[tuple[float, int]]] = {n: [] for n in pids}
        self.stop = threading.Event()

    def run(self) -> None:
        procs = {n: psutil.Process(p) for n, p in self.pids.items()}
        while not self.stop.is_set():
            now = time.time()  # wall clock: the peers' log lines carry it
            for name, proc in procs.items():
                with contextlib.suppress(psutil.Error):
                    self.samples[name].append((now, proc.memory_info().rss))
            time.sleep(0.1)


def stamp_lines(log: Path, pattern: str, timeout_s: float) -> float:
    """This process's clock when ``pattern`` first appears in ``log``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and re.search(pattern, log.read_text(errors="replace")):
            return time.time()
        time.sleep(0.05)
    raise TimeoutError(f"{pattern!r} not in {log} within {timeout_s} s")


def peer_read_rate(run: Path, seq: int, sequences: int = 20000) -> float:
    """Tokens/s a peer's data path gives: sequences read from one peer's token file (the shards it
    fetched), as the trainer reads them (``TokenDataset.sequence``), in this process."""
    from potluck.model.corpus.manifest import decode_manifest
    from potluck.model.corpus.tokens import ShardedTokens

    cache = next(p for p in run.rglob("corpora/*") if (p / "manifest.json").is_file())
    tokens = ShardedTokens(decode_manifest((cache / "manifest.json").read_bytes()), cache, seq)
    have = sorted(tokens.have)
    span = (have[0] * tokens.manifest.shard_tokens, (have[0] + 1) * tokens.manifest.shard_tokens)
    n = max(1, min(sequences, (span[1] - span[0]) // seq - 1))
    start = time.perf_counter()
    for i in range(n):
        tokens.dataset.sequence(span[0] // seq + i)
    return n * seq / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="a 4-layer d=256 model (smoke run)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--corpus-mb", type=float, default=8.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", type=Path, default=None, help="work in this directory and keep it (logs)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-models-") as tmp:
        root = args.keep or Path(tmp)
        owner = root / "owner"
        n_params = make_model(owner / "model", args.small)
        make_corpus(owner / "corpus", args.corpus_mb)
        make_tokenizer(owner / "model", owner / "corpus")
        seq = 128
        job = write_job(
            owner / "job.toml",
            {"name": "bench-models", "steps": args.steps, "min_peers": 4},
            model={"from": "model", "seq_len": seq},
            batch={"tokens_per_step": seq * 8, "micro_batch_size": 2},
            data={"source": "directory", "path": "corpus"},
            checkpoint={"dir": str(owner / "ckpt"), "interval": args.steps},
            limits={"stages": 2, "replicas": 2},
        )
        peer_args = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu")
        with LocalSwarm(root / "run", job, swarm_id="bench-models", peer_args=peer_args, verbose=1) as swarm:
            start_on_own_disks(swarm, PEERS)
            watch = RssWatch({n: swarm.procs[n].pid for n in PEERS})
            watch.start()
            log = swarm.procs["coordinator"].log
            placed = stamp_lines(log, r"plan epoch 1\b", 600)
            first = stamp_lines(log, r"step 1/", 1800)
            swarm.procs["coordinator"].popen.wait(timeout=3600)
            watch.stop.set()
            text = log.read_text(errors="replace")
            peer_logs = {n: swarm.procs[n].log.read_text(errors="replace") for n in PEERS}
        ratios = {}
        for name in PEERS:
            loaded = re.search(r"^(\S+ \S+) .*resumed at step 0 from", peer_logs[name], re.M)
            if loaded is None:
                continue
            done_at = datetime.strptime(loaded.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            before = [r for t, r in watch.samples[name] if t <= placed]
            during = [r for t, r in watch.samples[name] if placed <= t <= done_at + 0.2]
            fetched = re.search(r"fetched (\d+) bytes of layers", peer_logs[name])  # step 0: weights only
            stage_bytes = int(fetched.group(1)) if fetched else 0
            if before and during and stage_bytes:
                ratios[name] = (max(during) - before[-1]) / stage_bytes
            read_tps = peer_read_rate(root / "run", seq)
        built = re.search(r"data: ([\d,]+) documents, ([\d,]+) tokens", text)
        tokens_total = int(built.group(2).replace(",", "")) if built else 0
        took = re.search(r"tokens in \d+ shards in ([\d.]+) s", text)
        build_tps = tokens_total / float(took.group(1)) if took and float(took.group(1)) > 0 else 0.0
        rates = [float(r) for r in re.findall(r"([\d.]+) tok/s", text)]
        trained_tps = max(rates) if rates else 0.0

        out = root / "exported"
        t0 = time.monotonic()
        export = [sys.executable, "-m", "potluck", "export", str(owner / "ckpt"), str(out)]
        done = subprocess.run(export, capture_output=True, text=True, check=False)
        import transformers

        transformers.AutoModelForCausalLM.from_pretrained(out)
        export_s = time.monotonic() - t0
    data_tps = min(build_tps, read_tps)
    result = {
        "n_params": n_params,
        "load_rss_ratio": round(max(ratios.values()), 3) if ratios else None,
        "load_rss_ratio_per_peer": {k: round(v, 3) for k, v in ratios.items()},
        "first_step_s": round(first - placed, 1),
        "trained_tokens_per_s": trained_tps,
        "corpus_tokens": tokens_total,
        "build_tokens_per_s": round(build_tps),
        "peer_read_tokens_per_s": round(read_tps),
        "data_tokens_per_s_ratio": round(data_tps / trained_tps, 1) if trained_tps else None,
        "export_s": round(export_s, 2),
        "export_ok": done.returncode == 0,
    }
    print(json.dumps(result) if args.json else result)


if __name__ == "__main__":
    main()
