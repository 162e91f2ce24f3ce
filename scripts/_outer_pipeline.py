"""2 pipeline stages x 2 replicas, token-matched, with and without compression (issue 22), in one process.

Used by ``bench_compression_training.py --pipeline``. Each stage is a ``StageRunner`` (the class a peer
trains with: the job's transformer layers and AdamW); a replica's micro-batch goes through stage 0, its
activations through the activation codec to stage 1, the loss, and the activation gradients back through
the codec to stage 0.

- Baseline, fp32 data parallelism: each step, AdamW on the replicas' mean fp32 gradient (every sequence
  of the global batch weighted alike), fp32 activations; it uploads 4 bytes per parameter per replica
  per step.
- Coded outer sync, what a job with ``compression.outer`` runs (first with fp32 activations, so its gap
  is the gradient side's alone, then with the activation codec as well): each replica takes
  ``sync_every`` AdamW steps on its own half of the global batch, then per stage ``DiLoCo`` with the
  job's ``OuterCodec`` (``peer/train/outer.py``'s ``make_diloco``: outer SGD with the job's ``outer_lr``
  and Nesterov ``outer_momentum``, 0.7 and 0.9 by default), both
  replicas decoding the same payloads in the same order.

Bytes per token, per link kind: activations forward, activation gradients backward (payload bytes over
tokens trained), replica sync (every replica's outer payloads, over tokens trained). The gap is
(final eval loss - baseline's) / baseline's, per seed; the eval runs through the same codecs.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from potluck.compression import get_codec
from potluck.model.data import ByteTokenizer, TokenDataset, generated_corpus
from potluck.model.optim import clip_coefficient, learning_rate
from potluck.model.stage import StageRunner
from potluck.model.transformer import StageModel
from potluck.peer.train.outer import make_diloco
from potluck.protocol.jobspec import CompressionSpec, ModelSpec, OptimizerSpec

REPLICAS = 2
# name -> (layers, width, heads, sequences per step, tokens per sequence). "demo" is `potluck demo`'s
# model and batch (4 x 128, 32 sequences of 64); the 8-layer d=256 one takes shorter steps to stay
# affordable on 2 shared cores (16 sequences of 32 tokens).
PIPE_MODELS = {"demo": (4, 128, 4, 32, 64), "d256x8": (8, 256, 4, 16, 32)}
EVAL_SEQUENCES = 64
CORPUS_CHARS = 400_000


def _spec(name: str, rank: int | None = None, side_path: bool = False) -> tuple[ModelSpec, int]:
    """The model (with ``model.bottleneck_rank = rank`` at the cut when given, and its token side path
    with ``side_path``) and its sequences a step."""
    layers, d, heads, per_step, seq = PIPE_MODELS[name]
    spec = ModelSpec(
        n_layers=layers,
        d_model=d,
        n_heads=heads,
        vocab_size=256,
        seq_len=seq,
        bottleneck_rank=rank,
        bottleneck_tokens=side_path and rank is not None,
    )
    return spec, per_step


def _data(seed: int, seq: int) -> tuple[TokenDataset, torch.Tensor]:
    tok = ByteTokenizer()
    train = TokenDataset(tok.encode(generated_corpus(CORPUS_CHARS, seed)), seq)
    held = TokenDataset(tok.encode(generated_corpus(EVAL_SEQUENCES * (seq + 1) * 2, 10_000 + seed)), seq)
    return train, torch.stack([held.sequence(i) for i in range(EVAL_SEQUENCES)])


def _stages(spec: ModelSpec, seed: int, opt: OptimizerSpec) -> list[StageRunner]:
    half = spec.n_layers // 2
    return [
        StageRunner(spec, a, b, seed, opt, torch.device("cpu"), "fp32")
        for a, b in ((0, half), (half, spec.n_layers))
    ]


class Boundary:
    """The link between the stages: activations forward and their gradients back through a codec."""

    def __init__(self, spec: str) -> None:
        self.codec = None if spec == "none" else get_codec(spec)
        self.fwd = self.bwd = 0  # payload bytes
        self.encode_s = 0.0

    def send(self, t: torch.Tensor, forward: bool) -> torch.Tensor:
        if self.codec is None:
            n = 4 * t.numel()
            self.fwd, self.bwd = (self.fwd + n, self.bwd) if forward else (self.fwd, self.bwd + n)
            return t
        t0 = time.perf_counter()
        data = self.codec.encode(t.detach())
        self.encode_s += time.perf_counter() - t0
        self.fwd, self.bwd = (self.fwd + len(data), self.bwd) if forward else (self.fwd, self.bwd + len(data))
        return self.codec.decode(data, expect=t.shape)


def _train_step(
    stages: list[StageRunner], batch: torch.Tensor, link: Boundary, lr: float, opt: OptimizerSpec
) -> None:
    s0, s1 = stages
    h = s0.forward(0, batch[:, :-1])
    s1.forward(0, link.send(h, True), batch[:, 1:], tokens=batch[:, :-1])
    g = s1.backward(0)
    assert g is not None
    s0.backward(0, link.send(g, False))
    coef = clip_coefficient(opt, math.sqrt(s0.grad_sq_norm() + s1.grad_sq_norm()))
    s0.step(lr, coef)
    s1.step(lr, coef)


def _eval(stages: list[StageRunner], held: torch.Tensor, link: Boundary) -> float:
    s0, s1 = stages
    with torch.no_grad():
        h = s0.model(held[:, :-1])
        if link.codec is not None:
            h = link.codec.decode(link.codec.encode(h))
        return float(StageModel.loss(s1.model(h, held[:, :-1]), held[:, 1:]))


def run_pipeline(
    model: str,
    seed: int,
    steps: int,
    opt: OptimizerSpec,
    comp: CompressionSpec | None,
    rank: int | None = None,
    side_path: bool = False,
) -> dict[str, Any]:
    """One run: ``comp`` None is the fp32 data-parallel baseline; else the job's compression settings;
    ``rank``: a learned bottleneck of that rank at the cut (``model.bottleneck_rank``), with its token
    side path when ``side_path`` (``model.bottleneck_tokens``)."""
    spec, per_step = _spec(model, rank, side_path)
    train, held = _data(seed, spec.seq_len)
    link = Boundary("none" if comp is None else comp.activations)
    tokens = steps * per_step * spec.seq_len
    t_start = time.perf_counter()
    if comp is None:
        stages = _stages(spec, seed, opt)
        nparams = sum(p.numel() for s in stages for p in s.params)
        for step in range(steps):
            _train_step(
                stages, train.replica_batch(step, 0, 1, per_step), link, learning_rate(opt, step, steps), opt
            )
        sync_bytes = 4 * nparams * REPLICAS * steps  # each replica's fp32 gradient, every step
        out = {"loss": _eval(stages, held, link), "params": nparams, "encode_s": 0.0, "syncs": steps}
    else:
        reps = [_stages(spec, seed, opt) for _ in range(REPLICAS)]
        nparams = sum(p.numel() for s in reps[0] for p in s.params)
        dilocos = [[make_diloco(s.params, comp) for s in rep] for rep in reps]  # [replica][stage]
        sync_bytes, encode_s, syncs = 0, 0.0, 0
        for step in range(steps):
            lr = learning_rate(opt, step, steps)
            for r, rep in enumerate(reps):
                _train_step(rep, train.replica_batch(step, r, REPLICAS, per_step), link, lr, opt)
            if (step + 1) % comp.sync_every:
                continue
            syncs += 1
            for j in range(2):
                t0 = time.perf_counter()
                payloads = [d[j].encode_outer() for d in dilocos]  # what each replica sends
                encode_s += time.perf_counter() - t0
                sync_bytes += sum(len(p) for ps in payloads for p in ps)
                mean = dilocos[0][j].decode_outer(payloads)  # every replica decodes the same bytes alike
                for d in dilocos:
                    d[j].apply_outer(mean)
        same = all(
            torch.equal(a, b)
            for s in range(2)
            for a, b in zip(reps[0][s].params, reps[1][s].params, strict=True)
        )
        out = {"loss": _eval(reps[0], held, link), "params": nparams, "encode_s": encode_s, "syncs": syncs}
        out["replicas_identical"] = same
    seconds = time.perf_counter() - t_start
    out.update(
        {
            "seconds": round(seconds, 1),
            "act_fwd_bytes_per_token": link.fwd / tokens,
            "act_bwd_bytes_per_token": link.bwd / tokens,
            "sync_bytes_per_token": sync_bytes / tokens,
            # the outer codec's encodes (once per sync) and the activation codec's, against the run's
            # time (training, syncs and codecs of both replicas, one after the other in one process)
            "grad_encode_share": out["encode_s"] / seconds,
            "act_encode_share": link.encode_s / seconds,
        }
    )
    return out


def pipeline_bench(
    models: list[str],
    seeds: list[int],
    steps: int,
    comp: CompressionSpec,
    opt: OptimizerSpec,
    act: str,
    rank: int | None = None,
    side_path: bool = False,
) -> dict[str, Any]:
    """Per model and seed: the baseline, the coded outer sync alone (fp32 activations) and, with ``act``
    other than "none", the same with the activation codec (behind a bottleneck of ``rank`` when given:
    the whole job, both ends compressed); and the summary figures."""
    result: dict[str, Any] = {}
    grad_only = comp.model_copy(update={"activations": "none"})
    job = comp.model_copy(update={"activations": act})
    for model in models:
        base = {s: run_pipeline(model, s, steps, opt, None) for s in seeds}
        grad = {s: run_pipeline(model, s, steps, opt, grad_only) for s in seeds}
        both = {}
        if act != "none":
            both = {s: run_pipeline(model, s, steps, opt, job, rank, side_path) for s in seeds}
        gaps = [(grad[s]["loss"] - base[s]["loss"]) / base[s]["loss"] for s in seeds]
        res: dict[str, Any] = {
            "baseline": base,
            "grad_runs": grad,
            "grad_gaps": gaps,
            "grad_gap_mean": statistics.mean(gaps),
            "grad_gap_worst": max(gaps),
            "grad_ratio": min(
                base[s]["sync_bytes_per_token"] / grad[s]["sync_bytes_per_token"] for s in seeds
            ),
            "grad_encode_share": max(r["grad_encode_share"] for r in grad.values()),
            "replicas_identical": all(r["replicas_identical"] for r in [*grad.values(), *both.values()]),
        }
        line = (
            f"{model}: replica sync {res['grad_ratio']:.0f}x fewer bytes, gaps "
            f"{[f'{100 * g:+.2f}%' for g in gaps]} (worst {100 * res['grad_gap_worst']:+.2f}%), outer encode "
            f"{100 * res['grad_encode_share']:.2f}% of the run"
        )
        if both:
            job_gaps = [(both[s]["loss"] - base[s]["loss"]) / base[s]["loss"] for s in seeds]
            b0, j0 = base[seeds[0]], both[seeds[0]]
            res |= {
                "job_runs": both,
                "job_gaps": job_gaps,  # activation codec and coded outer sync together, against fp32 DP
                "job_gap_mean": statistics.mean(job_gaps),
                "job_gap_worst": max(job_gaps),
                "act_fwd_ratio": b0["act_fwd_bytes_per_token"] / j0["act_fwd_bytes_per_token"],
                "act_bwd_ratio": b0["act_bwd_bytes_per_token"] / j0["act_bwd_bytes_per_token"],
                "act_encode_share": max(r["act_encode_share"] for r in both.values()),
            }
            line += (
                f"; with {act} activations{'' if rank is None else f' behind rank {rank}'} "
                f"({res['act_fwd_ratio']:.1f}x fwd, "
                f"{res['act_bwd_ratio']:.1f}x bwd): "
                f"gaps {[f'{100 * g:+.2f}%' for g in job_gaps]} (worst {100 * res['job_gap_worst']:+.2f}%)"
            )
        result[model] = res
        print(line, flush=True)
    return result
