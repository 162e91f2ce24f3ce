#!/usr/bin/env python3
"""Two peer processes sharing one GPU train as a 1 x 2 swarm; their loss follows the CPU's.

For each model (the demo's 4-layer d-128, and a 12-layer d-768), a coordinator in this process and
two ``potluck peer --device cuda`` processes (each capped with ``--max-memory``) train the job on
loopback, 1 stage x 2 replicas (``--grid 2x1``: a 2-stage pipeline instead). The swarm's loss curve
(bf16 autocast on the GPU) is compared step by step with the single-process fp32 reference computed
on the CPU (``model/reference.py``): each sampled step within ``--rel-tol``. Reported: tokens/s, the
peers' step-time split, and GPU utilisation and memory sampled by ``nvidia-smi`` during the run.

    python3 scripts/gpu_swarm_check.py                          # on a CUDA machine; JSON to $OUT if set
    python3 scripts/gpu_swarm_check.py --cpu-dry-run            # tiny models, peers on the CPU in bf16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS: dict[str, dict[str, Any]] = {
    "demo": {"n_layers": 4, "d_model": 128, "n_heads": 4, "vocab_size": 256, "seq_len": 64},
    "d768": {"n_layers": 12, "d_model": 768, "n_heads": 12, "vocab_size": 256, "seq_len": 256},
}
TINY = {"n_layers": 2, "d_model": 32, "n_heads": 2, "vocab_size": 256, "seq_len": 16}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-dry-run", action="store_true", help="tiny models, peers on the CPU (bf16 autocast)")
    p.add_argument("--models", default="demo,d768", help="comma-separated: demo, d768")
    p.add_argument("--steps", type=int, default=None, help="steps per model (default: 60 demo, 30 d768)")
    p.add_argument("--grid", default="1x2", help="stages x replicas (1x2 or 2x1)")
    p.add_argument("--device", default=None, help="the peers' --device (default: cuda, dry run: cpu)")
    p.add_argument("--precision", default=None, help="the peers' --precision (default: auto, dry run: bf16)")
    p.add_argument("--max-memory", default="24GiB", help="each peer's --max-memory")
    p.add_argument("--threads", type=int, default=4, help="CPU threads per peer")
    p.add_argument("--rel-tol", type=float, default=0.03, help="largest relative loss gap to the reference")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per model's run")
    p.add_argument("--run-dir", type=Path, default=None, help="keep logs and checkpoints here")
    p.add_argument("--out", type=Path, default=None, help="JSON report (default: $OUT/gpu_swarm.json)")
    return p.parse_args(argv)


def job_for(name: str, steps: int, grid: tuple[int, int], ckpt: Path, dry: bool) -> Any:
    from potluck.protocol.jobspec import parse_job

    model = TINY if dry else MODELS[name]
    seqs = 8 if dry else (32 if name == "demo" else 16)
    stages, replicas = grid
    return parse_job(
        {
            "name": f"gpu-{name}",
            "seed": 0,
            "steps": steps,
            "min_peers": stages * replicas,
            "model": model,
            "batch": {"tokens_per_step": model["seq_len"] * seqs, "micro_batch_size": 4 if dry else 8},
            "data": {"source": "generated", "generated_chars": 400_000},
            "optimizer": {"lr": 3e-3 if name == "demo" else 1e-3, "warmup_steps": min(10, steps // 3)},
            "checkpoint": {"dir": str(ckpt), "interval": steps, "keep": 1},
            "limits": {"stages": stages, "replicas": replicas},
        },
        source=f"gpu check {name}",
    )


class SmiSampler:
    """``nvidia-smi`` utilisation and memory every ``period_s`` in a thread; nothing without it."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.period_s, self.samples = period_s, []  # (utilisation %, memory MiB)
        self.available = shutil.which("nvidia-smi") is not None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SmiSampler:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.available:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        query = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
        while not self._stop.wait(self.period_s):
            try:
                line = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout.splitlines()[0]
                util, mem = (float(v) for v in line.split(",")[:2])
                self.samples.append((util, mem))
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                continue

    def summary(self) -> dict[str, Any]:
        if not self.samples:
            return {"available": self.available, "samples": 0}
        util = [u for u, _ in self.samples]
        busy = util[len(util) // 10 :]  # past start-up (processes launching, the probe)
        return {
            "available": True,
            "samples": len(util),
            "util_mean": round(sum(busy) / len(busy), 1),
            "util_max": max(util),
            "memory_max_mib": max(m for _, m in self.samples),
        }


def reference_losses(job: Any, n_replicas: int) -> list[float]:
    """The single-process fp32 run on the CPU: what the swarm must follow."""
    from potluck.model.data import load_dataset
    from potluck.model.reference import reference_run

    data, _ = load_dataset(job.data, job.model.seq_len, job.model.vocab_size, job.seed)
    losses, _ = reference_run(job, data, n_replicas=n_replicas)
    return losses


def compare(swarm: dict[int, float], ref: list[float], rel_tol: float) -> dict[str, Any]:
    """Swarm losses (by steps done) against the reference's (0-based step): the largest gap."""
    gaps = {
        k: abs(v - ref[k - 1]) / max(abs(ref[k - 1]), 1e-8) for k, v in swarm.items() if 0 < k <= len(ref)
    }
    worst = max(gaps.items(), key=lambda kv: kv[1]) if gaps else (None, float("inf"))
    return {
        "compared_steps": len(gaps),
        "worst_step": worst[0],
        "worst_rel_gap": round(worst[1], 5),
        "within_tolerance": bool(gaps) and worst[1] <= rel_tol,
        "loss_first": {"swarm": swarm[min(swarm)], "reference": ref[min(swarm) - 1]} if swarm else None,
        "loss_last": {"swarm": swarm[max(swarm)], "reference": ref[max(swarm) - 1]} if swarm else None,
    }


async def run_model(name: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from potluck.cli.demo_cmd import run_local_job

    stages, replicas = (int(v) for v in args.grid.lower().split("x"))
    steps = args.steps or (6 if args.cpu_dry_run else (60 if name == "demo" else 30))
    run_dir = root / name
    job = job_for(name, steps, (stages, replicas), run_dir / "checkpoints", args.cpu_dry_run)
    device = args.device or ("cpu" if args.cpu_dry_run else "cuda")
    precision = args.precision or ("bf16" if args.cpu_dry_run else "auto")
    extra = ("--device", device, "--precision", precision, "--max-memory", args.max_memory)
    t0 = time.monotonic()
    with SmiSampler() as smi:
        summary, watcher = await run_local_job(
            job, run_dir, args.timeout, args.threads, peer_extra=lambda i: extra
        )
    wall = time.monotonic() - t0
    t1 = time.monotonic()
    ref = await asyncio.to_thread(reference_losses, job, replicas)
    split: dict[str, float] = {}
    for steps_seen in watcher.timings.values():
        for t in steps_seen.values():
            for part in ("compute", "send", "recv", "allreduce", "total"):
                split[part] = split.get(part, 0.0) + getattr(t, part)
    n_timed = sum(len(v) for v in watcher.timings.values()) or 1
    return {
        "model": name,
        "grid": f"{stages}x{replicas}",
        "device": device,
        "precision": precision,
        "steps": steps,
        "summary": summary,
        "seconds": round(wall, 1),
        "reference_seconds": round(time.monotonic() - t1, 1),
        "tokens_per_s": summary.get("tokens_per_s"),
        "step_split_s": {k: round(v / n_timed, 4) for k, v in split.items()},
        "gpu": smi.summary(),
        "loss": compare(dict(watcher.losses), ref, args.rel_tol),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.cpu_dry_run:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device: run with --cpu-dry-run to exercise the script on the CPU", file=sys.stderr)
            return 2
    root = args.run_dir or Path(tempfile.mkdtemp(prefix="potluck-gpu-swarm-"))
    report: dict[str, Any] = {"dry_run": args.cpu_dry_run, "rel_tol": args.rel_tol, "runs": []}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if name not in MODELS:
            print(f"unknown model {name!r}: use {', '.join(MODELS)}", file=sys.stderr)
            return 2
        try:
            run = asyncio.run(run_model(name, args, root))
        except (Exception, SystemExit) as e:  # typer.Exit from a failed run: report it, go on
            run = {"model": name, "error": f"{type(e).__name__}: {e}"[:500], "logs": str(root / name)}
        report["runs"].append(run)
        print(json.dumps(run, indent=1, default=str), flush=True)
    report["ok"] = all("error" not in r and r["loss"]["within_tolerance"] for r in report["runs"])
    out = args.out or (Path(os.environ["OUT"]) / "gpu_swarm.json" if os.environ.get("OUT") else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {out}")
    print("OK" if report["ok"] else "FAILED", f"(logs in {root})")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
