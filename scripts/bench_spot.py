"""Pipeline spot checks: what sealing and checking cost, and how soon a corrupting stage is convicted.

A pipeline job of 2 stages x ``--replicas`` replicas (p2pd daemons on loopback, one process). Runs:

- ``off``: ``trust.spot_checks = 0`` (messages unsealed, nothing checked): the baseline step time;
- ``rate=F`` for each ``--rates`` value on the clean job: the median step time (sealing, evidence,
  weight copies and replays included), checks made, failed checks of honest peers (must stay 0);
- ``attack`` at each rate: replica ``replicas - 1`` of stage 0 sends its activations x1.5 (sealed with its
  own key, as any peer can): the first step after which the others' testimony convicts it
  (``coordinator/job/accuse.py`` on the trainers' audits), and honest peers convicted (must be 0).

Also what sealing costs per message in a step of 8 messages of 64 KiB to one receiver (one Ed25519
signature over their Merkle root, one check at the receiver; medians of 250 steps); and
how far a bf16-autocast forward (a GPU stage) lands from the fp32 replay of a GPU stage's CPU copy,
measured with the CPU's bf16 autocast (``--autocast-only`` prints just that).

    python scripts/bench_spot.py [--steps 120] [--replicas 3] [--rates 0.01,0.05] [--json]

With ``--json`` the last line is one JSON object: ``overhead`` (per rate, median step time over the
``off`` run's, minus 1), ``convicted_at`` (per rate; null if not within ``--steps``), ``honest_failed``,
``honest_convicted``, ``seal_us``, ``verify_us``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from potluck.compat import use_fork  # noqa: E402
from potluck.coordinator.job.accuse import AccuseConfig, hostile_peers  # noqa: E402
from potluck.net.tags import Round, Stream, make_tag  # noqa: E402
from potluck.peer.seal import Ledger  # noqa: E402
from potluck.protocol.identity import Identity  # noqa: E402
from potluck.testbed.harness.training import tiny_job, train_swarm, witness_records  # noqa: E402


def seal_cost(messages: int = 8) -> tuple[float, float]:
    """Per message, medians of 250 steps: sealing a step of ``messages`` 64 KiB messages to one receiver
    (one signature over their Merkle root) and checking that step seal at the receiver (one check)."""
    a, b = Identity.generate(), Identity.generate()
    a_id, b_id = a.peer_id, b.peer_id  # derived from the key at each use
    payload, step = bytes(64 * 1024), Round(1, 1)
    tags = [make_tag(step, Stream.ACTIVATIONS, chunk=c) for c in range(messages)]
    signs, checks = [], []
    for _ in range(250):
        sender, receiver = Ledger(a), Ledger(b)
        t0 = time.perf_counter()
        for tag in tags:
            sender.note(b_id, tag, payload)
        seal = sender.close(step)[b_id]
        t1 = time.perf_counter()
        for tag in tags:
            receiver.hold(a_id, tag, payload)
        receiver.accept(a_id, step, seal)
        checks.append((time.perf_counter() - t1) / messages)
        signs.append((t1 - t0) / messages)
    return 1e6 * statistics.median(signs), 1e6 * statistics.median(checks)


def autocast_gap() -> dict[str, float]:
    """Relative L2 of a stage's bf16-autocast output against fp32, at initialisation."""
    from potluck.model.transformer import StageModel
    from potluck.protocol.jobspec import ModelSpec

    torch.manual_seed(0)
    out = {}
    for layers, d in ((4, 256), (8, 512)):
        spec = ModelSpec(n_layers=layers, d_model=d, n_heads=8, vocab_size=4096, seq_len=128)
        model = StageModel(spec, 1, layers, 3)
        x = torch.randn(2, 128, d)
        with torch.no_grad():
            y = model(x)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                yb = model(x).float()
        out[f"{layers - 1}x{d}"] = float((yb - y).norm() / y.norm())
    return out


def run(job, replicas: int, attack: bool, tmp: Path) -> dict[str, object]:  # type: ignore[no-untyped-def]
    liar = (0, replicas - 1)
    convicted: dict[str, int] = {}

    def corrupt(trainers) -> None:  # type: ignore[no-untyped-def]
        if attack:
            runner = trainers[liar].runner
            forward = runner.forward
            runner.forward = lambda m, x, t=None, w=1.0, ids=None: forward(m, x, t, w, ids) * 1.5

    def on_step(key, report, trainers) -> None:  # type: ignore[no-untyped-def]
        if key == (0, 0):
            for peer, _ in hostile_peers(trainers[key].plan, witness_records(trainers), AccuseConfig()):
                convicted.setdefault(peer, report.step + 1)

    n = job.model.n_layers
    started = time.perf_counter()
    reports, trainers = asyncio.run(
        train_swarm(job, 2, replicas, [(0, n // 2), (n // 2, n)], tmp, setup=corrupt, on_step=on_step)
    )
    attacker = trainers[liar].box.peer_id if attack else None
    honest = {tr.box.peer_id for k, tr in trainers.items() if tr.box.peer_id != attacker}
    mine = reports[(0, 0)]
    return {
        "rate": job.trust.spot_checks,
        "attack": attack,
        "steps": len(mine),
        "median_step_s": statistics.median(r.seconds for r in mine[3:]),
        "checks": sum(sum(tr.audit.checked.values()) for tr in trainers.values()),
        "honest_failed": sum(tr.audit.failed[p] for tr in trainers.values() for p in honest),
        "convicted_at": convicted.get(attacker) if attacker else None,
        "honest_convicted": len(set(convicted) & honest),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--rates", default="0.01,0.05")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--autocast-only", action="store_true")
    args = ap.parse_args()
    use_fork()
    torch.set_num_threads(1)
    if args.autocast_only:
        print(json.dumps({"bf16_vs_fp32": autocast_gap()}))
        return
    seal_us, verify_us = seal_cost()
    rows: list[dict[str, object]] = []

    def go(rate: float, attack: bool) -> dict[str, object]:
        # 4 sequences of 32 tokens per replica in micro-batches of 1: 4 micro-batches per replica and step
        job = tiny_job(
            steps=args.steps,
            model={"d_model": 64, "seq_len": 32},
            batch={"tokens_per_step": 32 * 4 * args.replicas, "micro_batch_size": 1},
            compression={"activations": "int8:block=64"},
            trust={"spot_checks": rate},
        )
        with tempfile.TemporaryDirectory(prefix="potluck-bench-spot-") as tmp:
            row = run(job, args.replicas, attack, Path(tmp))
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        return row

    base = go(0.0, False)
    rates = [float(r) for r in args.rates.split(",")]
    clean = {r: go(r, False) for r in rates}
    attacked = {r: go(r, True) for r in rates}
    base_s = float(base["median_step_s"])  # type: ignore[arg-type]
    summary = {
        "replicas": args.replicas,
        "steps": args.steps,
        "seal_us": round(seal_us, 1),
        "verify_us": round(verify_us, 1),
        "overhead": {r: float(row["median_step_s"]) / base_s - 1.0 for r, row in clean.items()},  # type: ignore[arg-type]
        "checks": {r: row["checks"] for r, row in clean.items()},
        "convicted_at": {r: row["convicted_at"] for r, row in attacked.items()},
        "honest_failed": sum(int(row["honest_failed"]) for row in rows),  # type: ignore[call-overload]
        "honest_convicted": sum(int(row["honest_convicted"]) for row in rows),  # type: ignore[call-overload]
        "bf16_vs_fp32": autocast_gap(),
    }
    print(json.dumps(summary) if args.json else summary)


if __name__ == "__main__":
    main()
