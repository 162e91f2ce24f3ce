#!/usr/bin/env python3
"""Benchmark potluck.compression codecs against hivemind 1.1.12's codecs on the same tensors.

Fixtures (made at run time, fixed seed): gradients and layer-2 activations of a small decoder-only LM
trained a few AdamW steps on a synthetic noisy-affine token task, plus a heavy-tailed (Student-t, df=2)
synthetic tensor. For each codec: bytes/element (real serialized bytes, headers included, one payload
per parameter tensor), ratio vs fp32, relative L2 error, and encode / decode GB/s (GB of fp32 input per
second; best of --reps runs) on one 16M-element tensor, next to the machine's copy bandwidth
(``out.copy_(x)`` into a reused buffer) measured in the same run, interleaved with each codec's
timing. Encodes are timed twice: into a fresh ``bytes`` (``encode``) and into a reused buffer
(``encode_into``, the copy's fair twin); the issue-17 targets compare int8's reused-buffer encode,
encode + error feedback and decode + accumulate with the copy measured just before them. Then a
convergence simulation: 4 data-parallel workers in one process train the LM with each
gradient scheme (3 seeds), and a 3-epoch fine-tune with activation-delta coding at a pipeline cut.

    .venv/bin/python scripts/bench_codecs.py --out bench-out/bench_codecs.json
    .venv/bin/python scripts/bench_codecs.py --quick          # smaller, for a smoke run
    .venv/bin/python scripts/bench_codecs.py --specs int8,int4,int2 --skip-hivemind --skip-convergence --json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _codec_training import TinyLM, activation_finetune, convergence, lm_loss, make_data

from potluck.compression import ErrorFeedback, get_codec

GRAD_SPECS = [
    "fp16",
    "bf16",
    "bf16|zstd",
    "int8:block=4096",
    "int8",
    "int8|zstd",
    "int4",
    "int4|zstd",
    "int4:rounding=stochastic",
    "int2",
    "int2|zstd",
    "topk:density=0.1|int4|zstd",
    "topk:density=0.01|int4|zstd",
    "topk:density=0.01,method=chunk|int4|zstd",
    "randk:density=0.1|int8",
    "powersgd:rank=4|fp16",
]
HIVEMIND = [
    "Float16Compression",
    "ScaledFloat16Compression",
    "Uniform8BitQuantization",
    "Quantile8BitQuantization",
]


# ---- the tiny LM --------------------------------------------------------------------------------


def fixtures(quick: bool) -> dict[str, list[torch.Tensor]]:
    torch.manual_seed(0)
    d, layers, seq, vocab = (128, 2, 32, 128) if quick else (256, 4, 64, 256)
    model = TinyLM(vocab, d, layers, 4, seq)
    data = make_data(512, seq, vocab, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(20):
        batch = data[(step * 16) % 512 :][:16]
        opt.zero_grad()
        lm_loss(model, batch).backward()
        opt.step()
    opt.zero_grad()
    lm_loss(model, data[:32]).backward()
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    with torch.no_grad():
        acts = [model.hidden(data[i : i + 8, :-1], layers // 2).clone() for i in range(0, 64, 8)]
    heavy = [torch.distributions.StudentT(2.0).sample((1 << 20,)) * 1e-3]
    return {"lm_gradients": grads, "lm_activations": acts, "heavy_tailed": heavy}


# ---- measurement helpers ------------------------------------------------------------------------
def timeit(fn: Callable[[], Any], reps: int) -> float:
    """Best of ``reps`` after two warm-ups. The 2 cores are shared with other jobs, whose bursts make
    medians swing 10x between runs; the minimum is the reproducible, uncontended figure."""
    fn()
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def copy_gbps(x: torch.Tensor, reps: int) -> float:
    out = torch.empty_like(x)
    return x.numel() * 4 / 1e9 / timeit(lambda: out.copy_(x), reps)


def quality(
    encode: Callable[[torch.Tensor], Any],
    decode: Callable[[Any], torch.Tensor],
    size: Callable[[Any], int],
    tensors: list[torch.Tensor],
) -> dict[str, float]:
    nbytes = 0
    err2 = 0.0
    ref2 = 0.0
    n = 0
    for t in tensors:
        payload = encode(t)
        y = decode(payload).float().reshape(t.shape)
        nbytes += size(payload)
        err2 += float((y - t.float()).double().pow(2).sum())
        ref2 += float(t.double().pow(2).sum())
        n += t.numel()
    return {
        "bytes_per_elem": nbytes / n,
        "ratio_vs_fp32": 4 * n / nbytes,
        "rel_l2": math.sqrt(err2 / max(ref2, 1e-300)),
    }


def bench_ours(spec: str, fx: dict[str, list[torch.Tensor]], big: torch.Tensor, reps: int) -> dict[str, Any]:
    codec = get_codec(spec)
    row: dict[str, Any] = {"codec": spec, "impl": "potluck"}
    for name, tensors in fx.items():
        row[name] = quality(lambda t: codec.encode(t, key=(1, 2)), codec.decode, len, tensors)
    data = codec.encode(big, key=(1, 2))
    gb = big.numel() * 4 / 1e9
    row["copy_gbps"] = copy_gbps(big, reps)
    row["encode_gbps"] = gb / timeit(lambda: codec.encode(big, key=(1, 2)), reps)
    buf = bytearray(len(data) + (1 << 20))  # room for chains whose size varies (top-k, zstd)
    row["encode_into_gbps"] = gb / timeit(lambda: codec.encode_into(big, buf, key=(1, 2)), reps)
    ef = ErrorFeedback()
    row["encode_ef_gbps"] = gb / timeit(lambda: codec.encode(big, key=(1, 2), state=ef), reps)
    ef2 = ErrorFeedback()
    row["encode_ef_into_gbps"] = gb / timeit(lambda: codec.encode_into(big, buf, key=(1, 2), state=ef2), reps)
    row["decode_gbps"] = gb / timeit(lambda: codec.decode(data), reps)
    acc = torch.zeros_like(big)
    row["decode_into_gbps"] = gb / timeit(lambda: codec.decode_into(data, acc), reps)
    return row


def bench_hivemind(
    name: str, fx: dict[str, list[torch.Tensor]], big: torch.Tensor, reps: int
) -> dict[str, Any]:
    import hivemind.compression as hc

    comp = getattr(hc, name)()

    def enc(t: torch.Tensor) -> Any:
        return comp.compress(t, hc.CompressionInfo.from_tensor(t))

    row: dict[str, Any] = {"codec": name, "impl": "hivemind 1.1.12"}
    for fname, tensors in fx.items():
        row[fname] = quality(enc, comp.extract, lambda p: len(p.SerializeToString()), tensors)
    gb = big.numel() * 4 / 1e9
    proto = enc(big)
    row["copy_gbps"] = copy_gbps(big, reps)
    row["encode_gbps"] = gb / timeit(lambda: enc(big).SerializeToString(), reps)
    row["decode_gbps"] = gb / timeit(lambda: comp.extract(proto), reps)
    return row


def bench_topk_speed(big: torch.Tensor, reps: int) -> dict[str, float]:
    from potluck.compression.stages.base import StageCtx
    from potluck.compression.stages.sparsify import TopKStage

    k = big.numel() // 100
    ctx = StageCtx(torch.float32, tuple(big.shape), 1)
    out = {"torch_topk_s": timeit(lambda: torch.topk(big.abs(), k, sorted=False), reps)}
    for method in ("sample", "chunk"):
        st = TopKStage("topk", {"density": "0.01", "method": method})
        out[f"{method}_s"] = timeit(lambda st=st: st.select(big, ctx), reps)  # type: ignore[misc]
        out[f"{method}_density"] = st.select(big, ctx)[1].numel() / big.numel()
    return out


# ---- activation-delta fine-tune (AC-SGD) ----------------------------------------------------------


# ---- main -----------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-out/bench_codecs.json")
    ap.add_argument("--quick", action="store_true", help="small fixtures and few steps (smoke run)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--skip-convergence", action="store_true")
    ap.add_argument("--skip-hivemind", action="store_true")
    ap.add_argument("--md", help="also write the tables as markdown to this path")
    ap.add_argument("--specs", help="comma-separated subset of our codecs to run (default: all)")
    ap.add_argument("--threads", type=int, help="torch threads for the codec timings (default: torch's)")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of the headline figures")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    fx = fixtures(args.quick)
    big = torch.distributions.StudentT(2.0).sample((1 << (20 if args.quick else 24),)) * 1e-3
    result: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "load_avg": os.getloadavg(),
        },
        "fixtures": {k: sum(t.numel() for t in v) for k, v in fx.items()},
        "timing_elements": big.numel(),
        "rows": [],
    }
    result["copy_gbps_start"] = copy_gbps(big, args.reps)
    for spec in args.specs.split(",") if args.specs else GRAD_SPECS:
        row = bench_ours(spec, fx, big, args.reps)
        result["rows"].append(row)
        print(_fmt(row))
    if not args.skip_hivemind:
        for name in HIVEMIND:
            row = bench_hivemind(name, fx, big, args.reps)
            result["rows"].append(row)
            print(_fmt(row))
    result["copy_gbps_end"] = copy_gbps(big, args.reps)
    result["targets"] = targets(big, args.reps)
    for name, t in result["targets"].items():
        print(
            f"  {name}: {t['value']:.0%} of copy (target >= {t['target']:.0%}) "
            + ("met" if t["met"] else "MISSED")
        )
    result["topk_speed"] = bench_topk_speed(big, max(3, args.reps // 2))
    print("top-k 1% selection:", {k: round(v, 4) for k, v in result["topk_speed"].items()})
    if not args.skip_convergence:
        # one thread: these models are tiny, and two spinning OpenMP threads on 2 shared cores made each
        # backward pass ~50x slower than one thread under load
        torch.set_num_threads(1)
        steps = 40 if args.quick else args.steps
        print(f"convergence: 4 workers, {args.seeds} seeds, {steps} steps")
        result["convergence"] = convergence(args.seeds, steps, args.quick)
        print("activation-delta fine-tune (3 epochs):")
        result["activation_finetune"] = activation_finetune(args.seeds, args.quick)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    if args.md:
        Path(args.md).write_text(markdown(result))
        print(f"wrote {args.md}")
    if args.json:
        line: dict[str, Any] = {"copy_gbps": result["copy_gbps_start"]}
        line.update({name: round(t["value"], 3) for name, t in result["targets"].items()})
        for row in result["rows"]:
            for k in ("encode_gbps", "encode_into_gbps", "encode_ef_into_gbps", "decode_into_gbps"):
                line[f"{row['codec']}:{k}"] = round(row[k], 2) if k in row else None
        print(json.dumps(line))


# issue 17: the one-pass CPU encoder against a copy of the same tensor
TARGETS = {"int8_encode_vs_copy": 0.50, "int8_encode_ef_vs_copy": 0.30, "int8_decode_add_vs_copy": 0.50}


def targets(big: torch.Tensor, reps: int, rounds: int = 5) -> dict[str, dict[str, Any]]:
    """Each round times the copy and then the three int8 paths (best of ``reps`` each); a target's
    figure is the median over rounds of its ratio to that round's copy. On 2 shared cores the copy
    alone swings 2x (one or two free cores), and pairing keeps each ratio to one state of the box."""
    codec = get_codec("int8")
    data = codec.encode(big, key=(1, 2))
    buf = bytearray(len(data))
    ef, acc = ErrorFeedback(), torch.zeros_like(big)
    gb = big.numel() * 4 / 1e9
    ratios: dict[str, list[float]] = {name: [] for name in TARGETS}
    copies = []
    for _ in range(rounds):
        copy = copy_gbps(big, reps)
        copies.append(copy)
        timed = {
            "int8_encode_vs_copy": lambda: codec.encode_into(big, buf, key=(1, 2)),
            "int8_encode_ef_vs_copy": lambda: codec.encode_into(big, buf, key=(1, 2), state=ef),
            "int8_decode_add_vs_copy": lambda: codec.decode_into(data, acc),
        }
        for name, fn in timed.items():
            ratios[name].append(gb / timeit(fn, reps) / copy)
    out = {}
    for name, target in TARGETS.items():
        value = statistics.median(ratios[name])
        out[name] = {"value": value, "target": target, "met": value >= target, "rounds": ratios[name]}
    out["int8_encode_vs_copy"]["copy_gbps_rounds"] = copies
    return out


def markdown(r: dict[str, Any]) -> str:
    """The result as markdown tables (for docs/benchmarks.md)."""
    m = r["machine"]
    lines = [
        f"Command: `{r['command']}`  ",
        f"Machine: {m['platform']}, {m['cpus']} CPUs, torch {m['torch']} ({m['threads']} threads), "
        f"load average at start {tuple(round(x, 1) for x in m['load_avg'])}; timings are the best of "
        f"--reps runs on {r['timing_elements']:,} fp32 elements (GB/s of fp32 input), next to the copy "
        f"bandwidth measured just before each row (`out.copy_(x)`, reused buffer).",
        "",
        "| impl | codec | LM grads bytes/el | ratio vs fp32 | rel L2 err (grads) | err (acts) | err (heavy) "
        "| enc GB/s | enc-into GB/s | enc+EF GB/s (into) | dec GB/s | dec-into GB/s | copy GB/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        g, a, h = row["lm_gradients"], row["lm_activations"], row["heavy_tailed"]
        ef = f"{row['encode_ef_gbps']:.2f}" if "encode_ef_gbps" in row else "-"
        if "encode_ef_into_gbps" in row:
            ef += f" ({row['encode_ef_into_gbps']:.2f})"
        into = f"{row['encode_into_gbps']:.2f}" if "encode_into_gbps" in row else "-"
        di = f"{row['decode_into_gbps']:.2f}" if "decode_into_gbps" in row else "-"
        name = row["codec"].replace("|", "\\|")  # a bare | would split the table cell
        lines.append(
            f"| {row['impl']} | `{name}` | {g['bytes_per_elem']:.3f} | {g['ratio_vs_fp32']:.1f}x "
            f"| {g['rel_l2']:.4f} | {a['rel_l2']:.4f} | {h['rel_l2']:.4f} | {row['encode_gbps']:.2f} "
            f"| {into} | {ef} "
            f"| {row['decode_gbps']:.2f} | {di} | {row['copy_gbps']:.1f} |"
        )
    if r.get("targets"):
        lines += [
            "",
            "| target (int8, vs the copy measured just before) | measured | target | |",
            "|---|---|---|---|",
        ]
        for name, t in r["targets"].items():
            lines.append(
                f"| {name} | {t['value']:.0%} | >= {t['target']:.0%} | {'met' if t['met'] else 'missed'} |"
            )
    t = r["topk_speed"]
    lines += [
        "",
        f"Top-1% selection on {r['timing_elements']:,} elements: "
        f"`torch.topk` {t['torch_topk_s'] * 1e3:.0f} ms, "
        f"sampled threshold {t['sample_s'] * 1e3:.0f} ms (density {t['sample_density']:.4f}), "
        f"chunked {t['chunk_s'] * 1e3:.0f} ms (density {t['chunk_density']:.4f}).",
    ]
    if "convergence" in r:
        lines += [
            "",
            "| gradient scheme (4 workers) | mean final eval loss | mean gap vs none | worst gap "
            "| bytes vs fp32 |",
            "|---|---|---|---|---|",
        ]
        for name, res in r["convergence"].items():
            lines.append(
                f"| {name} | {res['mean_loss']:.4f} | {100 * res['mean_gap_rel']:+.2f}% "
                f"| {100 * res['max_gap_rel']:+.2f}% | {res['ratio_vs_fp32_per_step']:.1f}x fewer |"
            )
    if "activation_finetune" in r:
        af = r["activation_finetune"]
        lines += [
            "",
            f"Activation-delta fine-tune (3 epochs, DeltaCoder bits=2 first=4 + zstd, backward int8): "
            f"{af['mean_bits_per_elem']:.2f} bits per forward element on average, eval-loss gap "
            f"{100 * af['mean_gap_rel']:+.3f}% mean, {100 * af['max_gap_rel']:+.3f}% worst over "
            f"{len(af['runs'])} seeds.",
        ]
    return "\n".join(lines) + "\n"


def _fmt(row: dict[str, Any]) -> str:
    g = row["lm_gradients"]
    a = row["lm_activations"]
    h = row["heavy_tailed"]
    return (
        f"{row['impl'][:8]:8s} {row['codec']:42s} grad b/el {g['bytes_per_elem']:.3f} "
        f"x{g['ratio_vs_fp32']:6.1f} "
        f"err {g['rel_l2']:.4f} | act err {a['rel_l2']:.4f} | heavy err {h['rel_l2']:.4f} | "
        f"enc {row['encode_gbps']:.2f} dec {row['decode_gbps']:.2f} GB/s (copy {row['copy_gbps']:.1f})"
        + (f" ef {row['encode_ef_gbps']:.2f}" if "encode_ef_gbps" in row else "")
    )


if __name__ == "__main__":
    main()
