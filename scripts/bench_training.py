"""Benchmark the demo swarm: tokens/s, per-peer step-time breakdown vs the planner's prediction, and
bytes on the wire per step, compressed (the default int8 codecs) vs uncompressed.

Each configuration runs the real thing: the coordinator in this process, 4 `potluck peer` processes
(2 stages x 2 replicas) on loopback, the embedded demo model. Timings come from the peers' signed
progress records (each peer measures its own step); the first `--skip` steps (warm-up, plan start) are
left out of the averages.

    python scripts/bench_training.py --steps 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from potluck.cli.demo_cmd import run_local_job
from potluck.cli.views.job import JobWatcher
from potluck.compat import use_fork
from potluck.coordinator.job.plan import calibrated_tflops, message_costs, network, predict_step
from potluck.coordinator.placement.costmodel import DeviceSpec
from potluck.protocol.jobspec import JobSpec
from potluck.testbed.demojob import demo_job

PARTS = ("compute", "send", "recv", "allreduce", "idle", "total", "round_trip", "hold")


def run(label: str, steps: int, codecs: str, threads: int, skip: int, timeout: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="potluck-bench-train-") as tmp:
        job = demo_job(steps, Path(tmp) / "checkpoints")
        comp = job.compression.model_copy(
            update={"activations": codecs, "gradients": codecs, "error_feedback": codecs != "none"}
        )
        job = job.model_copy(update={"compression": comp})
        summary, watcher = asyncio.run(run_local_job(job, Path(tmp), timeout, threads))
    report = timing_report(watcher, job, skip)
    return {
        "label": label,
        "codecs": codecs,
        "steps": summary["steps"],
        "tokens_per_s": summary["tokens_per_s"],
        "loss_first": summary["loss_first"],
        "loss_last": summary["loss_last"],
        "bytes_per_step": summary["bytes_per_step"],
        **report,
    }


def timing_report(watcher: JobWatcher, job: JobSpec, skip: int) -> dict[str, Any]:
    """Per-peer step-time breakdown (means over steps after ``skip``; a peer with none keeps all its
    records, for short runs), the slowest peer's step, the plan's predicted step, and the same model on
    the same plan with each peer's speed calibrated from its measured compute, over the links the peers
    measured meanwhile (checks the model's structure apart from the start-up probe)."""
    plan, state = watcher.plan, watcher.swarm_state
    assert plan is not None and state is not None
    job = plan.under(job)  # priced with what the peers ran: the plan's compression under "auto"
    per_peer: dict[str, dict[str, float]] = {}
    compute: dict[str, float] = {}
    round_trip: dict[str, float] = {}
    hold: dict[str, float] = {}
    for peer, by_step in watcher.timings.items():
        kept = [t for s, t in sorted(by_step.items()) if s > skip] or list(by_step.values())
        if not kept:
            continue
        compute[peer] = statistics.mean(t.compute for t in kept)
        round_trip[peer] = statistics.mean(t.round_trip for t in kept)
        hold[peer] = statistics.mean(t.hold for t in kept)
        pos = plan.position(peer)
        if pos is not None:
            per_peer[f"s{pos[0]}r{pos[1]}"] = {
                part: statistics.mean(getattr(t, part) for t in kept) for part in PARTS
            } | {"samples": len(kept)}
    # None when no placed peer's timings were read at all (a run of a few steps on a loaded machine)
    measured = max((p["total"] for p in per_peer.values()), default=None)
    order = sorted(p for st in plan.stages for p in st.peers)
    tflops = calibrated_tflops(plan, job, compute)
    net, net_note = network(state, order)
    # what a pipeline message cost under load, each way (its encode, transit, decode and a busy
    # peer's delays): the probe measured the links idle
    messages = message_costs(plan, round_trip, hold)
    # A peer whose timings the watcher never read (a short run on a loaded machine) leaves the model
    # uncalibrated: no figure rather than a made-up speed.
    unread = [p for p in order if p not in tflops]
    calibrated, breakdown = None, None
    if not unread and measured is not None:
        devices = {p: DeviceSpec(tflops=tflops[p], memory_gb=8.0) for p in order}
        br = predict_step(plan, job, devices, net, order, messages=messages)
        calibrated = br.total
        breakdown = {
            "pipeline_s": br.pipeline,
            "sync_exposed_s": br.dp_exposed,
            "stage_compute_s": list(br.stage_compute),  # per micro-batch
            "link_s": list(br.link),  # per micro-batch, one direction, the slowest matched link
            "sync_s": list(br.dp_sync),
            "commit_s": br.commit,
            "message_s": sorted(messages.values()),  # one way, per pipeline pair, measured
        }
    predicted = plan.predicted_step_s
    return {
        "step_s": measured,
        "predicted_step_s": predicted,
        "prediction_error": None if measured is None else (predicted - measured) / measured,
        "peers": per_peer,
        "calibrated_step_s": calibrated,
        "calibrated_error": None
        if calibrated is None or measured is None
        else (calibrated - measured) / measured,
        "calibrated_breakdown": breakdown,
        "uncalibrated_peers": unread,
        "links": net_note,
        "calibrated_tflops": tflops,
    }


def _figure(value: object, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def table(results: list[dict[str, object]]) -> str:
    lines = [
        "| run | tokens/s | step s (measured) | predicted s (probe) | error | predicted s (calibrated) "
        "| error | bytes/step | loss first -> last |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['label']} | {r['tokens_per_s']:,.0f} | {_figure(r['step_s'], '.3f')} | "
            f"{r['predicted_step_s']:.3f} | {_figure(r['prediction_error'], '+.0%')} | "
            f"{_figure(r['calibrated_step_s'], '.3f')} | "
            f"{_figure(r['calibrated_error'], '+.0%')} | "
            f"{r['bytes_per_step']:,} | "
            f"{r['loss_first']} -> {r['loss_last']} |"
        )
    lines += ["", "| run | peer | " + " | ".join(PARTS) + " |", "|---|---|" + "---|" * len(PARTS)]
    for r in results:
        for peer, t in sorted(r["peers"].items()):  # type: ignore[attr-defined]
            lines.append(f"| {r['label']} | {peer} | " + " | ".join(f"{t[p]:.3f}" for p in PARTS) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--skip", type=int, default=5, help="leading steps left out of the averages")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per peer process")
    ap.add_argument("--timeout", type=float, default=1200.0)
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    use_fork()
    results = [
        run("compressed (int8 + EF)", args.steps, "int8:block=64", args.threads, args.skip, args.timeout),
        run("uncompressed (fp32)", args.steps, "none", args.threads, args.skip, args.timeout),
    ]
    print(table(results))
    for r in results:
        print(f"{r['label']}: links {r['links']}; calibrated TFLOP/s {r['calibrated_tflops']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
