#!/usr/bin/env python3
"""The fused codec kernels on a GPU: bit-identical to the CPU path, and how close to copy bandwidth.

1. Bytes: for int8/int4/int2, nearest and stochastic rounding, with and without error feedback, the
   payloads of ``get_codec(spec).encode`` on a CUDA tensor (the Triton kernels) must equal those of the
   same call on the CPU, round after round, as must the decoded tensors (``decode`` on the host,
   ``decode_into`` a CUDA accumulator) and the error-feedback residuals.
2. Speed: the quantize (+ error feedback) and dequantize kernels (``compression.kernels.dispatch``, what
   ``encode`` runs on the device) against a device-to-device copy of the same tensor, as effective
   bandwidth (bytes read + written per second); target >= 70% of the copy. The public API's whole
   ``encode`` / ``decode_into`` (device -> host, checksum, bytes) is reported beside it, without target.

    python3 scripts/gpu_kernels_check.py                      # on a CUDA machine; JSON to $OUT if set
    python3 scripts/gpu_kernels_check.py --cpu-dry-run        # same code paths, tiny, on the CPU
    python3 scripts/gpu_kernels_check.py --cpu-dry-run --interpret   # the kernels in Triton's interpreter

Exit status: 1 if any payload differs (or, with --strict, a kernel is below target); 2 if no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET = 0.70  # of device-to-device copy bandwidth
BLOCK = 64


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-dry-run", action="store_true", help="run every path on the CPU, tiny sizes")
    p.add_argument("--interpret", action="store_true", help="(dry run) the Triton kernels, interpreted")
    p.add_argument("--out", type=Path, default=None, help="JSON report (default: $OUT/gpu_kernels.json)")
    p.add_argument("--elements", type=int, default=None, help="elements per bandwidth tensor")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--strict", action="store_true", help="exit 1 when a kernel misses the target")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu_dry_run and args.interpret:  # before triton or the kernels are imported
        os.environ.update(TRITON_INTERPRET="1", POTLUCK_CODEC_BACKEND="triton")
    import torch

    if not args.cpu_dry_run and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu-dry-run to exercise the script on the CPU", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.cpu_dry_run else "cuda")
    report: dict[str, Any] = {
        "device": _device_name(device),
        "torch": torch.__version__,
        "dry_run": args.cpu_dry_run,
    }
    report["triton"] = _triton_version()
    n_bits = 4096 + 37 if args.cpu_dry_run else (1 << 20) + 37  # a short last block too
    report["identity"] = identity_cases(device, n_bits)
    bad = [c for c in report["identity"] if not c["identical"]]
    n = args.elements or (1 << 16 if args.cpu_dry_run else 1 << 26)
    report["bandwidth"] = bandwidth(device, n, max(2, args.reps if not args.cpu_dry_run else 3))
    below = [b for b in report["bandwidth"]["kernels"] if b.get("ratio") is not None and b["ratio"] < TARGET]
    report["target"] = TARGET
    report["ok"] = not bad and not (args.strict and below)
    _print(report)
    out = args.out or (Path(os.environ["OUT"]) / "gpu_kernels.json" if os.environ.get("OUT") else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
        print(f"wrote {out}")
    return 0 if report["ok"] else 1


def identity_cases(device: Any, n: int) -> list[dict[str, Any]]:
    """CPU vs ``device`` payloads, decodes and residuals for every int codec, rounding and EF setting."""
    import torch

    from potluck.compression import ErrorFeedback, decode, get_codec

    cases = []
    for bits in (8, 4, 2):
        for rounding in ("nearest", "stochastic"):
            for ef in (False, True):
                spec = f"int{bits}:block={BLOCK},rounding={rounding}"
                codec = get_codec(spec)
                gen = torch.Generator().manual_seed(bits * 100 + len(rounding) + ef)
                ef_cpu, ef_dev = (ErrorFeedback(), ErrorFeedback()) if ef else (None, None)
                case: dict[str, Any] = {"spec": spec, "error_feedback": ef, "elements": n, "rounds": 3}
                diff_bytes = diff_decode = 0
                try:
                    for r in range(3):
                        x = torch.randn(n, generator=gen) * (0.01 + r)
                        x[:: max(1, n // 7)] *= 40.0  # outliers: blocks with very different scales
                        key = (11, r, bits)
                        host = codec.encode(x.clone(), key=key, state=ef_cpu)
                        dev = codec.encode(x.to(device), key=key, state=ef_dev)
                        diff_bytes += _differing(host, dev)
                        want = decode(host)
                        got = codec.decode_into(dev, torch.zeros(n, device=device), accumulate=True)
                        diff_decode += int((got.cpu() != want).sum())
                    if ef_cpu is not None and ef_dev is not None:
                        a, b = ef_cpu.residual, ef_dev.residual
                        case["residual_identical"] = (
                            a is not None and b is not None and torch.equal(a, b.cpu())
                        )
                    case.update(differing_bytes=diff_bytes, differing_decoded=diff_decode)
                    case["identical"] = (
                        diff_bytes == 0 and diff_decode == 0 and case.get("residual_identical", True)
                    )
                except Exception as e:  # a kernel that fails to build or launch: a failed case, named
                    case.update(identical=False, error=f"{type(e).__name__}: {e}"[:400])
                cases.append(case)
    return cases


def _differing(a: bytes, b: bytes) -> int:
    if len(a) != len(b):
        return max(len(a), len(b))
    return sum(x != y for x, y in zip(a, b, strict=True))


def _timer(device: Any, reps: int) -> Callable[[Callable[[], object]], float]:
    """Median seconds of ``fn`` over ``reps`` runs after two warm-ups (CUDA events on a GPU)."""
    import torch

    def run(fn: Callable[[], object]) -> float:
        for _ in range(2):
            fn()
        times = []
        for _ in range(reps):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return run


def bandwidth(device: Any, n: int, reps: int) -> dict[str, Any]:
    """Effective bandwidth of each kernel next to a device-to-device copy of the same tensor."""
    import torch

    timed = _timer(device, reps)
    x = torch.randn(n, device=device)
    dst = torch.empty_like(x)
    copy_s = timed(lambda: dst.copy_(x))
    copy_bw = 8 * n / copy_s  # read 4 bytes, write 4
    out: dict[str, Any] = {"elements": n, "copy_gb_s": round(copy_bw / 1e9, 2), "kernels": [], "api": []}
    for bits in (8, 4, 2):
        kernels, api = _one_width(x, bits, timed, copy_bw)
        out["kernels"] += kernels
        out["api"] += api
    return out


def _one_width(
    x: Any, bits: int, timed: Callable[[Callable[[], object]], float], copy_bw: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The kernels of one bit width (bytes moved: fp32 in, codes and bf16 scales out, and for error
    feedback the residual read and written), then the public API's encode and decode_into."""
    import torch

    from potluck.compression import get_codec
    from potluck.compression.kernels import dispatch

    n = x.numel()
    packed_b, scale_b = n * bits // 8, 2 * n // BLOCK
    e, resid = torch.zeros_like(x), torch.empty_like(x)
    runs: list[tuple[str, Callable[[], object], int]] = [
        (f"quantize int{bits}", lambda: dispatch.quantize(x, None, BLOCK, bits, None, False), 4 * n),
        (
            f"quantize+ef int{bits}",
            lambda: dispatch.quantize(x, e, BLOCK, bits, None, True, 0, resid),
            12 * n,
        ),
    ]
    kernels: list[dict[str, Any]] = []
    try:
        sb, pk, _, _ = dispatch.quantize(x, None, BLOCK, bits, None, False)
        runs.append((f"dequantize int{bits}", lambda: dispatch.dequantize(pk, sb, BLOCK, bits), 4 * n))
    except Exception as err:
        kernels.append({"kernel": f"dequantize int{bits}", "error": f"{type(err).__name__}: {err}"[:300]})
    for name, fn, fp32_bytes in runs:
        moved = fp32_bytes + packed_b + scale_b
        try:
            s = timed(fn)
            kernels.append(
                {"kernel": name, "gb_s": round(moved / s / 1e9, 2), "ratio": round(moved / s / copy_bw, 3)}
            )
        except Exception as err:  # the kernels' signature moved on: say so, keep going
            kernels.append({"kernel": name, "error": f"{type(err).__name__}: {err}"[:300]})
    codec = get_codec(f"int{bits}:block={BLOCK}")
    payload = codec.encode(x)
    acc = torch.zeros_like(x)
    api = []
    for name, fn in (
        (f"encode int{bits} (device -> bytes)", lambda: codec.encode(x)),
        (f"decode_into int{bits} (bytes -> device)", lambda: codec.decode_into(payload, acc)),
    ):
        s = timed(fn)
        api.append({"call": name, "input_gb_s": round(4 * n / s / 1e9, 2), "seconds": round(s, 6)})
    return kernels, api


def _device_name(device: Any) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)"


def _triton_version() -> str | None:
    try:
        import triton

        return str(triton.__version__)
    except ImportError:
        return None


def _print(report: dict[str, Any]) -> None:
    print(f"device {report['device']}  torch {report['torch']}  triton {report['triton']}")
    for c in report["identity"]:
        state = "identical" if c["identical"] else f"DIFFERS ({c.get('error') or c})"
        print(f"  {c['spec']:<36} ef={c['error_feedback']!s:<5} {state}")
    bw = report["bandwidth"]
    print(f"copy {bw['copy_gb_s']} GB/s on {bw['elements']} elements")
    for k in bw["kernels"]:
        if "error" in k:
            print(f"  {k['kernel']:<22} error: {k['error']}")
        else:
            mark = "ok" if k["ratio"] >= report["target"] else "below target"
            print(f"  {k['kernel']:<22} {k['gb_s']:>9} GB/s  {k['ratio']:.0%} of copy  {mark}")
    for a in bw["api"]:
        print(f"  {a['call']:<42} {a['input_gb_s']:>8} GB/s of fp32 input")
    print("OK" if report["ok"] else "FAILED")


if __name__ == "__main__":
    sys.exit(main())
