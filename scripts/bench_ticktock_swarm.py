#!/usr/bin/env python3
"""Tick-tock end to end (issue 19): a demo swarm where one peer hosts two replicas against one where
three peers host one each. Real processes on loopback: ``potluck launch`` and ``potluck peer``.

Both runs train the demo model (4 layers, d = 128, sequences of 64, 2048 tokens a step) as one stage x
three data-parallel replicas (``limits.stages = 1, replicas = 3``) with the demo's codecs (int8
gradients with error feedback; ``--gradients none`` for exact sums) for ``--steps`` steps:

- ``waves``: two peers; peer "a" is started with ``--slots 2``, so the only plan with three replicas
  gives it two replicas' shares, which it runs as two tick-tock waves;
- ``separate``: three peers, one replica each.

It prints each run's first and last loss (as ``potluck launch --json`` reports them), the swarm's
tokens/s, and the relative gap of the last losses. On one 2-core machine both runs share the same two
cores, so tokens/s compares the schedules, not what a second machine would add.

    python scripts/bench_ticktock_swarm.py [--steps 30] [--gradients none] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from potluck.testbed.localswarm import LocalSwarm  # noqa: E402

PEER_ARGS = ("--probe-seconds", "0.2", "--threads", "1", "--device", "cpu")


def job_text(steps: int, ckpt: Path, gradients: str | None) -> str:
    codec = (
        [] if gradients is None else ["[compression]", f'gradients = "{gradients}"', "error_feedback = false"]
    )
    return "\n".join(
        [
            'name = "ticktock-bench"',
            "seed = 0",
            f"steps = {steps}",
            "min_peers = 2",
            "[model]",
            "n_layers = 4",
            "d_model = 128",
            "n_heads = 4",
            "vocab_size = 256",
            "seq_len = 64",
            "[batch]",
            "tokens_per_step = 2048",
            "micro_batch_size = 4",
            "[data]",
            "generated_chars = 400000",
            "[optimizer]",
            "lr = 3e-3",
            "warmup_steps = 10",
            "[checkpoint]",
            f'dir = "{ckpt}"',
            f"interval = {steps}",
            "[limits]",
            "stages = 1",
            "replicas = 3",
            *codec,
        ]
    )


def run(
    root: Path, steps: int, gradients: str | None, peers: list[tuple[str, tuple[str, ...]]]
) -> dict[str, Any]:
    job = root / "job.toml"
    root.mkdir(parents=True)
    job.write_text(job_text(steps, root / "ckpt", gradients) + "\n")
    start = time.monotonic()
    with LocalSwarm(
        root / "run", job, swarm_id=root.name, peer_args=PEER_ARGS, coordinator_args=("--json",)
    ) as swarm:
        swarm.start_coordinator()
        for name, extra in peers:
            swarm.start_peer(name, *extra)
        coordinator = swarm.procs["coordinator"]
        coordinator.popen.wait(timeout=60 + 20 * steps)
        log = coordinator.log.read_text()
        if coordinator.popen.returncode != 0:
            raise SystemExit(f"{root.name}: launch failed\n{log[-3000:]}")
    summary = json.loads([line for line in log.splitlines() if line.startswith('{"steps"')][-1])
    summary["wall_s"] = round(time.monotonic() - start, 1)
    summary["tick_tock"] = "tick-tock" in log
    return dict(summary)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument(
        "--gradients",
        default=None,
        help='a gradient codec instead of the demo\'s int8 + EF ("none": exact sums)',
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="potluck-ticktock-") as tmp:
        waves = run(Path(tmp) / "waves", args.steps, args.gradients, [("a", ("--slots", "2")), ("b", ())])
        separate = run(Path(tmp) / "separate", args.steps, args.gradients, [("a", ()), ("b", ()), ("c", ())])
    gap = (waves["loss_last"] - separate["loss_last"]) / separate["loss_last"]
    for name, r in (("waves (2 peers)", waves), ("separate (3 peers)", separate)):
        print(
            f"{name:20s} loss {r['loss_first']:.4f} -> {r['loss_last']:.4f}  {r['tokens_per_s']:8.0f} tok/s  "
            f"replicas listed {r['replicas']}  tick-tock {r['tick_tock']}  {r['wall_s']} s"
        )
    print(f"last-loss gap (waves vs separate): {gap:+.3%}")
    if args.json:
        out = {
            "steps": args.steps,
            "gradients": args.gradients or "int8:block=64 + EF",
            "waves_loss_last": waves["loss_last"],
            "separate_loss_last": separate["loss_last"],
            "loss_gap": round(gap, 6),
            "waves_tokens_per_s": waves["tokens_per_s"],
            "separate_tokens_per_s": separate["tokens_per_s"],
            "waves_planned": waves["tick_tock"],
        }
        print(json.dumps(out))


if __name__ == "__main__":
    main()
