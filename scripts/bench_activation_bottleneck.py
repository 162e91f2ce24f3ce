#!/usr/bin/env python3
"""The library's activation bottleneck (issue 22), token-matched against an fp32 boundary, on the CPU.

Two pipeline stages (``StageRunner``, the class a peer runs) train a model split in half, once with
an fp32 boundary (the baseline) and once with ``model.bottleneck_rank = r`` (``model/bottleneck.py``):
the first stage sends r-dimensional codes through the activation codec, the second sends their
r-dimensional gradients back through the same codec, exactly as ``peer/train/pipeline.py`` does (one
codec per job, keyed by round, stream and micro-batch). Same seed, same tokens, same optimizer and
schedule (the demo job's: AdamW lr 3e-3, 10 warm-up steps, cosine to 0.1, clip 1.0).

Models: ``demo`` is ``potluck demo``'s job (4 layers, d=128, 4 heads, byte vocabulary, 64-token
sequences, 32 sequences per step in micro-batches of 4); ``d256x8`` is 8 layers of d=256 on the same
data and batch. The loss is measured on held-out sequences (the generated corpus with another seed)
through the same boundary, codec included. Figures:

- ``act_ratio`` / ``act_bwd_ratio``: fp32 bytes of the d-dimensional activations (their gradients)
  over the payload bytes actually sent (``len(codec.encode(...))``: headers, scales, checksums in);
- ``act_gap_mean`` / ``act_gap_worst``: (loss - baseline loss) / baseline loss over the seeds;
- ``encode_share``: seconds in encode + decode (both directions) over the seconds of the two stages'
  forward and backward, worst seed.

    python scripts/bench_activation_bottleneck.py --json                       # demo, seeds 0 1 2
    python scripts/bench_activation_bottleneck.py --model d256x8 --json
    python scripts/bench_activation_bottleneck.py --seeds 5 --rank 8 --codec 'int4:block=64|zstd'
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from potluck.compression import get_codec  # noqa: E402
from potluck.model.data import ByteTokenizer, TokenDataset, encode_corpus, generated_corpus  # noqa: E402
from potluck.model.optim import clip_coefficient, learning_rate  # noqa: E402
from potluck.model.stage import StageRunner  # noqa: E402
from potluck.protocol.jobspec import ModelSpec, OptimizerSpec  # noqa: E402

SEQ, VOCAB, PER_STEP, MICRO = 64, 256, 32, 4  # the demo job's batch: 32 sequences of 64 bytes
MODELS = {"demo": (4, 128, 4), "d256x8": (8, 256, 4)}  # layers, width, heads
OPT = OptimizerSpec(lr=3e-3, warmup_steps=10, min_lr_ratio=0.1)
EVAL_SEQS = 128


def corpus(seed: int, chars: int) -> TokenDataset:
    return TokenDataset(encode_corpus(ByteTokenizer(), generated_corpus(chars, seed)), SEQ)


def train(model: str, seed: int, steps: int, rank: int | None, spec_str: str) -> dict[str, Any]:
    """Train the two stages for ``steps``; the boundary is fp32 without ``rank``."""
    layers, d, heads = MODELS[model]
    spec = ModelSpec(
        n_layers=layers, d_model=d, n_heads=heads, vocab_size=VOCAB, seq_len=SEQ, bottleneck_rank=rank
    )
    torch.manual_seed(seed)
    stages = [StageRunner(spec, 0, layers // 2, seed, OPT), StageRunner(spec, layers // 2, layers, seed, OPT)]
    codec = get_codec(spec_str if rank else "none")
    data, held = corpus(seed, 400_000), corpus(10_000 + seed, 40_000)
    acc = {"fwd": 0, "bwd": 0, "fp32": 0, "codec_s": 0.0, "compute_s": 0.0}

    def cross(x: torch.Tensor, key: tuple[int, int, int], side: str) -> torch.Tensor:
        t0 = time.perf_counter()
        payload = codec.encode(x.detach(), key=key)
        out = codec.decode(payload, expect=tuple(x.shape))
        acc["codec_s"] += time.perf_counter() - t0
        acc[side] += len(payload)
        acc["fp32"] += 0 if side == "bwd" else 4 * x.shape[0] * x.shape[1] * d  # d-dim fp32 activations
        return out

    for step in range(steps):
        batch = data.replica_batch(step, 0, 1, PER_STEP)
        for m, (inputs, targets) in enumerate(data.micro_batches(batch, MICRO)):
            share = inputs.shape[0] / PER_STEP
            t0 = time.perf_counter()
            sent = stages[0].forward(m, inputs)
            acc["compute_s"] += time.perf_counter() - t0
            received = cross(sent, (step, 0, m), "fwd")
            t0 = time.perf_counter()
            stages[1].forward(m, received, targets, share)
            grad = stages[1].backward(m)
            acc["compute_s"] += time.perf_counter() - t0
            assert grad is not None
            back = cross(grad, (step, 1, m), "bwd")
            t0 = time.perf_counter()
            stages[0].backward(m, back)
            acc["compute_s"] += time.perf_counter() - t0
        coef = clip_coefficient(OPT, sum(s.grad_sq_norm() for s in stages) ** 0.5)
        for s in stages:
            s.step(learning_rate(OPT, step, steps), coef)
    with torch.no_grad():
        evald = held.replica_batch(0, 0, 1, EVAL_SEQS)
        x, y = evald[:, :-1], evald[:, 1:]
        h = stages[0].model(x)
        h = codec.decode(codec.encode(h, key=(steps, 0, 0)), expect=tuple(h.shape))
        loss = float(stages[1].model.loss(stages[1].model(h), y))
    out: dict[str, Any] = {"loss": loss, "encode_share": acc["codec_s"] / acc["compute_s"]}
    if rank:
        out["fwd_ratio"] = acc["fp32"] / acc["fwd"]
        out["bwd_ratio"] = acc["fp32"] / acc["bwd"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="demo")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="reported: 0 1 2; tune on 5")
    ap.add_argument("--steps", type=int, default=300, help="steps of 32 x 64 tokens (the demo's 300)")
    ap.add_argument("--rank", type=int, default=16, help="model.bottleneck_rank")
    ap.add_argument("--codec", default="int4:block=64|zstd", help="compression.activations")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of the headline figures")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    base, runs, gaps = {}, {}, []
    for s in args.seeds:
        base[s] = train(args.model, s, args.steps, None, "none")
        runs[s] = train(args.model, s, args.steps, args.rank, args.codec)
        gaps.append((runs[s]["loss"] - base[s]["loss"]) / base[s]["loss"])
        print(
            f"seed {s}: fp32 boundary {base[s]['loss']:.4f}, rank {args.rank} {args.codec} "
            f"{runs[s]['loss']:.4f} ({100 * gaps[-1]:+.2f}%), forward {runs[s]['fwd_ratio']:.1f}x, "
            f"backward {runs[s]['bwd_ratio']:.1f}x, codec {100 * runs[s]['encode_share']:.2f}% of compute",
            flush=True,
        )
    summary = {
        "model": args.model,
        "rank": args.rank,
        "codec": args.codec,
        "steps": args.steps,
        "seeds": args.seeds,
        "act_ratio": round(min(r["fwd_ratio"] for r in runs.values()), 1),
        "act_bwd_ratio": round(min(r["bwd_ratio"] for r in runs.values()), 1),
        "act_gap_mean": round(statistics.mean(gaps), 4),
        "act_gap_worst": round(max(gaps), 4),
        "encode_share": round(max(r["encode_share"] for r in runs.values()), 4),
        "baseline_loss": {s: round(b["loss"], 4) for s, b in base.items()},
        "loss": {s: round(r["loss"], 4) for s, r in runs.items()},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
