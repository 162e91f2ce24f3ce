"""The training half of scripts/bench_codecs.py: a small decoder-only LM on a synthetic noisy-affine token
task (its gradients and activations are the codec fixtures), the data-parallel convergence simulation of
each gradient scheme, and the fine-tune with activation-delta coding at a pipeline cut."""

from __future__ import annotations

import statistics
from typing import Any

import torch
from torch import nn

from potluck.compression import ErrorFeedback, get_codec


class TinyLM(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def hidden(self, tokens: torch.Tensor, upto: int | None = None) -> torch.Tensor:
        h = self.emb(tokens) + self.pos[: tokens.shape[1]]
        for blk in self.blocks[:upto]:
            h = blk(h, src_mask=self.mask[: tokens.shape[1], : tokens.shape[1]], is_causal=True)
        return h

    def tail(self, h: torch.Tensor, start: int) -> torch.Tensor:
        for blk in self.blocks[start:]:
            h = blk(h, src_mask=self.mask[: h.shape[1], : h.shape[1]], is_causal=True)
        return self.head(self.norm(h))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tail(self.hidden(tokens, 0), 0)


def make_data(n: int, seq: int, vocab: int, seed: int) -> torch.Tensor:
    """Noisy affine sequences: t_{i+1} = (a t_i + b) mod vocab, with 10% random tokens."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(1, 8, (n, 1), generator=g)
    b = torch.randint(0, vocab, (n, 1), generator=g)
    t0 = torch.randint(0, vocab, (n, 1), generator=g)
    steps = torch.arange(seq + 1)
    toks = t0.clone()
    out = [toks]
    for _ in range(seq):
        toks = (a * toks + b) % vocab
        out.append(toks)
    data = torch.cat(out, dim=1)
    noise = torch.rand(data.shape, generator=g) < 0.1
    data[noise] = torch.randint(0, vocab, (int(noise.sum()),), generator=g)
    del steps
    return data


def lm_loss(model: TinyLM, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def simulate(scheme: dict[str, Any], seed: int, steps: int, quick: bool) -> dict[str, float]:
    """4 workers. Per-step schemes average the decoded gradients before one shared AdamW step.
    ``local`` H schemes (DiLoCo-like, SGD outer step of lr 1) run H local AdamW steps per worker,
    then average the coded pseudo-gradients (start - local params) with error feedback."""
    workers = 4
    d, layers, seq, vocab = (64, 2, 16, 64) if quick else (64, 2, 32, 64)
    torch.manual_seed(seed)
    model = TinyLM(vocab, d, layers, 4, seq)
    data = make_data(4096, seq, vocab, 100 + seed)
    evald = make_data(256, seq, vocab, 999)
    codec = get_codec(scheme["spec"])
    params = list(model.parameters())
    efs = [[ErrorFeedback() for _ in params] for _ in range(workers)]
    sent = 0
    bs = 8
    local = scheme.get("local", 0)
    if not local:
        opt = torch.optim.AdamW(params, lr=2e-3)
        for step in range(steps):
            sums = [torch.zeros_like(p) for p in params]
            for w in range(workers):
                i = ((step * workers + w) * bs) % len(data)
                model.zero_grad()
                lm_loss(model, data[i : i + bs]).backward()
                for j, p in enumerate(params):
                    assert p.grad is not None
                    payload = codec.encode(
                        p.grad, key=(step, j, w), state=efs[w][j] if scheme.get("ef") else None
                    )
                    sent += len(payload)
                    codec.decode_into(payload, sums[j])
            for p, s in zip(params, sums, strict=True):
                p.grad = s / workers
            opt.step()
    else:
        import copy

        replicas = [copy.deepcopy(model) for _ in range(workers)]
        opts = [torch.optim.AdamW(r.parameters(), lr=2e-3) for r in replicas]
        outer_lr, outer_mom = scheme.get("outer", (1.0, 0.0))
        outer_opt = torch.optim.SGD(params, lr=outer_lr, momentum=outer_mom, nesterov=outer_mom > 0)
        for outer in range(steps // local):
            start = [p.detach().clone() for p in params]
            sums = [torch.zeros_like(p) for p in params]
            for w, (rep, opt) in enumerate(zip(replicas, opts, strict=True)):
                for h in range(local):
                    i = (((outer * local + h) * workers + w) * bs) % len(data)
                    opt.zero_grad()
                    lm_loss(rep, data[i : i + bs]).backward()
                    opt.step()
                for j, (p0, p) in enumerate(zip(start, rep.parameters(), strict=True)):
                    payload = codec.encode(p0 - p.detach(), key=(outer, j, w), state=efs[w][j])
                    sent += len(payload)
                    codec.decode_into(payload, sums[j])
            with torch.no_grad():
                for p, p0, s in zip(params, start, sums, strict=True):
                    p.copy_(p0)
                    p.grad = s / workers  # the averaged decoded pseudo-gradient
            outer_opt.step()
            with torch.no_grad():
                for rep in replicas:
                    for rp, p in zip(rep.parameters(), params, strict=True):
                        rp.copy_(p)
    with torch.no_grad():
        loss = float(lm_loss(model, evald))
    nparams = sum(p.numel() for p in params)
    fp32_bytes = 4 * nparams * workers * steps
    return {"loss": loss, "bytes_sent": sent, "ratio_vs_fp32_per_step": fp32_bytes / max(sent, 1)}


# ---- convergence simulation ---------------------------------------------------------------------
SCHEMES: dict[str, dict[str, Any]] = {
    "none": {"spec": "none"},
    "int8": {"spec": "int8"},
    "int4+EF": {"spec": "int4", "ef": True},
    "int2+EF": {"spec": "int2|zstd", "ef": True},
    "topk1%+int4+EF": {"spec": "topk:density=0.01|int4|zstd", "ef": True},
    # DiLoCo-like: H local AdamW steps, then the coded pseudo-gradient; outer SGD (lr, Nesterov momentum)
    # picked on a held-out seed (5) among (1.0, 0.5), (1.0, 0.7), (1.2, 0.5); (0.7, 0.9) was worse on seed 0
    "H8 avg: int2+EF": {"spec": "int2|zstd", "ef": True, "local": 8},
    "H8 nesterov: int4+EF": {"spec": "int4|zstd", "ef": True, "local": 8, "outer": (1.2, 0.5)},
    "H8 nesterov: int2+EF": {"spec": "int2|zstd", "ef": True, "local": 8, "outer": (1.2, 0.5)},
    "H16 nesterov: int2+EF": {"spec": "int2|zstd", "ef": True, "local": 16, "outer": (1.2, 0.5)},
}


def convergence(seeds: int, steps: int, quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, scheme in SCHEMES.items():
        runs = [simulate(scheme, s, steps, quick) for s in range(seeds)]
        out[name] = {"runs": runs}
        losses = [round(r["loss"], 4) for r in runs]
        print(f"  {name:22s} loss {losses}  ratio {runs[0]['ratio_vs_fp32_per_step']:.1f}x")
    base = [r["loss"] for r in out["none"]["runs"]]
    for res in out.values():
        gaps = [(r["loss"] - b) / b for r, b in zip(res["runs"], base, strict=True)]
        res["mean_loss"] = statistics.mean(r["loss"] for r in res["runs"])
        res["mean_gap_rel"] = statistics.mean(gaps)
        res["max_gap_rel"] = max(gaps)
        res["ratio_vs_fp32_per_step"] = statistics.mean(r["ratio_vs_fp32_per_step"] for r in res["runs"])
    return out


def activation_finetune(seeds: int, quick: bool, epochs: int = 3) -> dict[str, Any]:
    """Pretrain the LM (uncompressed), then fine-tune it for ``epochs`` epochs over a small set, with the
    forward activations at the middle boundary either sent raw or through DeltaCoder (and the backward
    activation gradients through int8). Reports bits per forward element and the final eval-loss gap."""
    import copy

    from potluck.compression.delta import DeltaCoder

    d, layers, seq, vocab = (64, 2, 16, 64) if quick else (64, 4, 32, 64)
    split, bs, nft = layers // 2, 8, 64 if quick else 128
    out: dict[str, Any] = {"runs": []}
    for seed in range(seeds):
        torch.manual_seed(seed)
        base = TinyLM(vocab, d, layers, 4, seq)
        pre = make_data(2048, seq, vocab, 50 + seed)
        opt = torch.optim.AdamW(base.parameters(), lr=2e-3)
        for step in range(60 if quick else 150):
            opt.zero_grad()
            lm_loss(base, pre[(step * 16) % 2048 :][:16]).backward()
            opt.step()
        ft, ev = make_data(nft, seq, vocab, 70 + seed), make_data(128, seq, vocab, 90 + seed)
        run: dict[str, Any] = {"seed": seed}
        for mode in ("none", "delta"):
            model = copy.deepcopy(base)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            tx, rx = DeltaCoder(bits=2, first=4, capacity=4096), DeltaCoder(bits=2, first=4, capacity=4096)
            bwd = get_codec("int8")
            fwd_bits, fwd_elems = 0, 0
            for _epoch in range(epochs):
                for b in range(0, nft, bs):
                    batch = ft[b : b + bs]
                    opt.zero_grad()
                    h = model.hidden(batch[:, :-1], split)
                    if mode == "delta":
                        data = tx.encode(h.detach(), list(range(b, b + bs)))
                        fwd_bits += 8 * len(data)
                        fwd_elems += h.numel()
                        hr = rx.decode(data).requires_grad_(True)
                        logits = model.tail(hr, split)
                    else:
                        logits = model.tail(h, split)
                    loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))
                    loss.backward()
                    if mode == "delta":
                        assert hr.grad is not None
                        h.backward(bwd.decode(bwd.encode(hr.grad)))
                    opt.step()
            with torch.no_grad():
                run[f"loss_{mode}"] = float(lm_loss(model, ev))
            if mode == "delta":
                run["fwd_bits_per_elem"] = fwd_bits / fwd_elems
                run["cache_bytes"] = tx.cache.nbytes
        run["gap_rel"] = (run["loss_delta"] - run["loss_none"]) / run["loss_none"]
        out["runs"].append(run)
        print(f"  seed {seed}: {run}")
    out["mean_bits_per_elem"] = statistics.mean(r["fwd_bits_per_elem"] for r in out["runs"])
    out["mean_gap_rel"] = statistics.mean(r["gap_rel"] for r in out["runs"])
    out["max_gap_rel"] = max(r["gap_rel"] for r in out["runs"])
    return out
