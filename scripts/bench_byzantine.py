"""Byzantine replicas: final-loss gap against the clean run, steps to conviction, robust-rule overhead.

A data-parallel job (one stage, ``--replicas`` replicas, p2pd daemons on loopback, one process) where
10%, 20% and 30% of the replicas attack every gradient contribution they send:

- ``sign_flip``: minus their honest gradient; ``scale100``: 100 x it; ``noise``: Gaussian noise 100 x
  its RMS; ``little``: "a little is enough" (Baruch et al. 2019), the honest replicas' mean minus z
  standard deviations per coordinate, z = 1, the attackers knowing every honest contribution.

Each attack runs under the plain mean and under the robust rule (``--rule``, default centered_clip).
Reported per run: the final loss (replica 0's committed loss of the last step), its gap to the clean
run's as a fraction of it, and the first step after which the other replicas' testimony convicts each
attacker (``coordinator/job/accuse.py`` on the trainers' audits, as the coordinator would read them from
progress records; under the robust rule with checks, by failed gradient checks alone, as
``protocol.training.gradients_rechecked`` says). A convicted attacker is banned ``--ban-delay`` steps later
(default 3: the coordinator's poll, ~2 s, plus the peers' next read of the ban list, one heartbeat, ~10
s, over steps of several seconds in a real job); from then on every shard owner leaves its contributions
out, as peers do once their ban list names it (the re-plan without it follows). Overhead: the robust
rule's median step time on clean runs over the mean's, each the median of ``--repeats`` interleaved runs,
with the job's default spot checks and audits (``overhead``) and without them (``overhead_rule_only``).

    python scripts/bench_byzantine.py [--steps 40] [--replicas 10] [--repeats 3] [--json]

With ``--json`` the last line is one JSON object: ``gap_20pct`` (robust rule, worst attack at 20%),
``gap_mean_20pct`` (the mean under that attack), ``ban_steps_max`` (slowest conviction among convicted
attackers; null if none), ``unconvicted`` (attacks whose attackers were never convicted), ``overhead``,
``overhead_rule_only``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
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
from potluck.net.config import TransportConfig  # noqa: E402
from potluck.net.mailbox import Mailbox  # noqa: E402
from potluck.protocol.training import gradients_rechecked  # noqa: E402
from potluck.testbed.harness.hostile import (  # noqa: E402
    HostileMailbox,
    Oracle,
    OracleMailbox,
    SpyMailbox,
    little_is_enough,
)
from potluck.testbed.harness.training import PROTOCOL, tiny_job, train_swarm, witness_records  # noqa: E402

ATTACKS = ("sign_flip", "scale100", "noise", "little")


def forge_for(attack: str):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(7)
    return {
        "sign_flip": lambda x: -x,
        "scale100": lambda x: 100.0 * x,
        "noise": lambda x: 100.0 * x.pow(2).mean().sqrt() * torch.randn(x.shape, generator=gen),
    }[attack]


def run(
    job, replicas: int, rule: str, attack: str | None, n_bad: int, tmp: Path, delay: int
) -> dict[str, object]:  # type: ignore[no-untyped-def]
    bad = set(range(replicas - n_bad, replicas)) if attack else set()
    oracle = Oracle(honest=replicas - 1 - n_bad)
    tcfg = TransportConfig(timeout_s=30)

    def make_box(replica: int, node) -> Mailbox:  # type: ignore[no-untyped-def]
        if replica in bad and attack == "little":
            return OracleMailbox(node, PROTOCOL, tcfg, oracle=oracle, fn=little_is_enough(1.0))
        if replica in bad:
            return HostileMailbox(node, PROTOCOL, tcfg, fn=forge_for(attack or ""))
        if attack == "little":
            return SpyMailbox(node, PROTOCOL, tcfg, oracle=oracle)
        return Mailbox(node, PROTOCOL, tcfg)

    convicted: dict[str, int] = {}
    banned: set[str] = set()  # what every peer's ban list says: their owners leave these out

    def on_step(key, report, trainers) -> None:  # type: ignore[no-untyped-def]
        if key != (0, 0) or not bad:
            return
        for tr in trainers.values():
            tr.audit.excluded = banned
        plan = trainers[key].plan
        rechecked = [j for j in range(len(plan.stages)) if gradients_rechecked(job, plan, j)]
        for peer, _ in hostile_peers(plan, witness_records(trainers), AccuseConfig(), rechecked):
            convicted.setdefault(peer, report.step + 1)
        banned.update(p for p, at in convicted.items() if report.step + 1 >= at + delay)

    started = time.perf_counter()
    reports, trainers = asyncio.run(
        train_swarm(
            job,
            1,
            replicas,
            [(0, job.model.n_layers)],
            tmp,
            aggregation=rule,
            make_box=make_box,
            on_step=on_step,
        )
    )
    wall = time.perf_counter() - started
    mine = reports[(0, 0)]
    attackers = {trainers[(0, r)].box.peer_id for r in bad}
    wrongly = sorted(set(convicted) - attackers)
    return {
        "rule": rule,
        "attack": attack or "none",
        "attackers": n_bad,
        "steps": len(mine),
        "final_loss": mine[-1].loss if mine else math.nan,
        "median_step_s": statistics.median(r.seconds for r in mine[3:]) if len(mine) > 3 else math.nan,
        "convicted_at": sorted(convicted[p] for p in attackers if p in convicted),
        "unconvicted": len(attackers - set(convicted)),
        "honest_convicted": len(wrongly),
        # gradient checks (peer/train/checks/recheck.py) made by every replica, and how many failed
        "rechecks": sum(t.rechecks.done for t in trainers.values() if t.rechecks is not None),
        "rechecks_failed": sum(t.rechecks.failed for t in trainers.values() if t.rechecks is not None),
        "wall_s": round(wall, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--replicas", type=int, default=10)
    ap.add_argument("--rule", default="centered_clip", choices=("centered_clip", "trimmed_mean"))
    ap.add_argument("--fractions", default="0.1,0.2,0.3")
    ap.add_argument("--attacks", default=",".join(ATTACKS))
    ap.add_argument(
        "--ban-delay", type=int, default=3, help="steps from conviction until the ban reaches the peers"
    )
    ap.add_argument("--repeats", type=int, default=3, help="clean runs of each kind timed for the overhead")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    use_fork()
    torch.set_num_threads(1)
    job = tiny_job(steps=args.steps, batch={"tokens_per_step": 16 * 2 * args.replicas})
    unchecked = job.model_copy(update={"trust": job.trust.model_copy(update={"spot_checks": 0.0})})
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="potluck-bench-byz-") as tmp:

        def go(rule: str, attack: str | None, n_bad: int, checks: bool = True) -> dict[str, object]:
            where = Path(tmp) / f"{rule}-{attack}-{n_bad}-{checks}-{len(rows)}"
            spec = job if checks else unchecked
            row = run(spec, args.replicas, rule, attack, n_bad, where, args.ban_delay)
            if not checks:
                row["rule"] = f"{rule} (no checks)"
            rows.append(row)
            print(json.dumps(row), flush=True)
            return row

        # Step times vary by +-5% between runs here: the overhead compares medians over interleaved
        # repeats of the clean runs (the first of each also gives the losses).
        clean = go("mean", None, 0)
        clean_robust = go(args.rule, None, 0)
        timed: dict[str, list[dict[str, object]]] = {"mean": [clean], "robust": [clean_robust], "rule": []}
        for _ in range(args.repeats):
            timed["rule"].append(go(args.rule, None, 0, checks=False))
            if len(timed["mean"]) < args.repeats:
                timed["mean"].append(go("mean", None, 0))
                timed["robust"].append(go(args.rule, None, 0))
        base = float(clean["final_loss"])  # type: ignore[arg-type]
        for frac in (float(f) for f in args.fractions.split(",")):
            n_bad = max(1, round(frac * args.replicas))
            for attack in args.attacks.split(","):
                for rule in (args.rule, "mean"):
                    go(rule, attack, n_bad)
    rows = [r for r in rows if "no checks" not in str(r["rule"])] + [
        r for r in rows if "no checks" in str(r["rule"])
    ]

    def step_s(key: str) -> float:
        return statistics.median(float(r["median_step_s"]) for r in timed[key])  # type: ignore[arg-type]

    for r in rows:
        r["gap"] = (float(r["final_loss"]) - base) / base  # type: ignore[arg-type]
    at20 = [r for r in rows if r["attackers"] == max(1, round(0.2 * args.replicas))]
    robust20 = [r for r in at20 if r["rule"] == args.rule]
    worst = max(robust20, key=lambda r: float(r["gap"])) if robust20 else None  # type: ignore[arg-type]
    mean_same = next(
        (r for r in at20 if r["rule"] == "mean" and worst and r["attack"] == worst["attack"]), None
    )
    convictions = [s for r in rows if r["rule"] == args.rule for s in r["convicted_at"]]  # type: ignore[attr-defined]
    summary = {
        "replicas": args.replicas,
        "steps": args.steps,
        "rule": args.rule,
        "clean_loss": base,
        "gap_20pct": worst["gap"] if worst else None,
        "worst_attack_20pct": worst["attack"] if worst else None,
        "gap_mean_20pct": mean_same["gap"] if mean_same else None,
        "ban_steps_max": max(convictions) if convictions else None,
        "unconvicted": sorted(
            {f"{r['attack']}@{r['attackers']}" for r in rows if r["rule"] == args.rule and r["unconvicted"]}
        ),
        "honest_convicted": sum(int(r["honest_convicted"]) for r in rows),  # type: ignore[call-overload]
        "overhead": step_s("robust") / step_s("mean") - 1.0,
        "overhead_rule_only": step_s("rule") / step_s("mean") - 1.0,  # without spot checks and audits
    }
    for r in rows:
        gap = 100 * float(r["gap"])  # type: ignore[arg-type]
        line = (
            f"{r['rule']:>14} {r['attack']:>9} x{r['attackers']}: loss {r['final_loss']:.4f} gap {gap:+.2f}%"
        )
        print(f"{line}  convicted at {r['convicted_at']}", file=sys.stderr)
    print(json.dumps(summary) if args.json else summary)


if __name__ == "__main__":
    main()
