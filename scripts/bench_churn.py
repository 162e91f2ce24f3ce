#!/usr/bin/env python
"""Volunteers come and go (issue 12): a bounded chaos run on 127.0.0.1 next to the same run without churn.

A coordinator (`potluck launch`) and N peers (`potluck peer`), each a real process with its own p2pd and
its own --state-dir (its key and its checkpoints: no disk is shared), train a small job forced to 2
pipeline stages whose step count outlasts the run. Every --interval seconds one random *placed* peer is
SIGKILLed (its process group, by PID) and a new peer is started in a fresh directory, for --duration
seconds counted from the first committed step. The same swarm then runs again with no churn (same job,
same seed, same duration) as the baseline.

    .venv/bin/python scripts/bench_churn.py                                # 6 peers, 300 s, a kill every 30 s
    .venv/bin/python scripts/bench_churn.py --duration 150 --interval 30 --json
    .venv/bin/python scripts/bench_churn.py --duration 40 --interval 15 --peers 4   # a quick smoke run

Everything is read from the coordinator's log, which has no timestamps of its own: the script reads it
every 0.2 s and stamps each new line (the coordinator polls the swarm every second, so times are good to
about 1 s). Lines used: "plan epoch N: S stages x R replicas, from step K" with its table (which peers
hold which stage), "step N/TOTAL  loss L  T tok/s" (the swarm's committed step; printed only when it
passes the highest step shown so far), "+ peer joined: ID" and "- peer left: ID".

Reported: throughput retained (committed steps per second over the window, churn over baseline; steps
redone after a restart from an older step count against it), recovery time per kill (the kill to the
first step line after the first plan epoch published after the kill), steps lost per kill (the highest
committed step seen before the kill minus the start step of that new epoch, floored at 0), the loss at
the churn run's last step next to the baseline's at the same step (the mean of the printed losses over
the last 50 steps, as one line is one batch's loss; and the nearest single line), and for each joiner
the time from its start to its first committed step (the first step line after a plan that places it)
next to its target, 1.5 x (the seconds its state transfers took: its state bytes / its download rate) +
60 s; issue 38 names the same figure time to first useful step (`first_useful_step_s`) and holds it to
+ 20 s instead (`first_useful_within_target`). State moved per event: every "fetched N bytes of
layers [a, b) in T s" line the peers logged between
that kill and the next (peers run with -v; their log lines carry wall-clock times).
With --json the last line is one JSON object. Ctrl-C or SIGTERM stops and reaps every process (LocalSwarm,
by PID).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from potluck.protocol.identity import Identity
from potluck.testbed.harness.jobs import job_toml
from potluck.testbed.localswarm import LocalSwarm

PEER_ARGS = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu")

PLAN_RE = re.compile(r"plan epoch (\d+): (\d+) stages x (\d+) replicas, from step (\d+)")
STEP_RE = re.compile(r"^step (\d+)/\d+\s+loss ([0-9.]+)")
JOINED_RE = re.compile(r"^\+ peer joined: (\w+)")
FETCH_RE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO potluck\.transfer\.pull .*?"
    r"fetched (\d+) bytes of layers \[\d+, \d+\) in ([0-9.]+) s"
)
LEFT_RE = re.compile(r"^- peer left:\s+(\w+)")
ROW_RE = re.compile(r"^[│┃|]\s*([^│┃|]*?)\s*[│┃|]")  # first cell of a table row
POLL_S = 0.2
LOSS_WINDOW = 50  # steps: the loss lines of one step are one batch's loss, so compare means over a window


@dataclass
class Plan:
    epoch: int
    stages: int
    replicas: int
    start: int
    t: float
    placed: dict[str, int] = field(default_factory=dict)  # 12-char peer id prefix -> stage
    spares: set[str] = field(default_factory=set)


@dataclass
class CoordinatorLog:
    """The coordinator's log read as it grows; every line stamped with the time it was first read."""

    path: Path
    known: dict[str, str] = field(default_factory=dict)  # 12-char id prefix -> peer name
    lines: list[tuple[float, str]] = field(default_factory=list)
    plans: list[Plan] = field(default_factory=list)
    steps: list[tuple[float, int, float]] = field(default_factory=list)  # (time, step, loss)
    joined: dict[str, float] = field(default_factory=dict)  # id prefix -> time of "+ peer joined"
    left: dict[str, float] = field(default_factory=dict)  # id prefix -> time of "- peer left"
    _offset: int = 0
    _partial: str = ""
    _row_kind: str = ""  # the kind of the table row being read: a stage number, "spare" or ""

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        self._offset += len(data)
        text = self._partial + data.decode(errors="replace")
        *complete, self._partial = text.split("\n")
        now = time.monotonic()
        for line in complete:
            self._parse(now, line.rstrip())

    def _parse(self, t: float, line: str) -> None:
        self.lines.append((t, line))
        if m := PLAN_RE.search(line):
            self.plans.append(Plan(*(int(g) for g in m.groups()), t=t))
            self._row_kind = ""
            return
        if m := STEP_RE.match(line):
            self.steps.append((t, int(m.group(1)), float(m.group(2))))
            return
        if m := JOINED_RE.match(line):
            self.joined.setdefault(m.group(1)[:12], t)
            return
        if m := LEFT_RE.match(line):
            self.left.setdefault(m.group(1)[:12], t)
            return
        if not self.plans or not (row := ROW_RE.match(line)):
            return
        first = row.group(1)
        if first:  # a new row; rows rich wrapped over several lines keep the kind of their first line
            self._row_kind = first if first == "spare" or first.isdigit() else ""
        plan = self.plans[-1]
        for prefix in self.known:
            if prefix in line:
                if self._row_kind.isdigit():
                    plan.placed[prefix] = int(self._row_kind)
                elif self._row_kind == "spare":
                    plan.spares.add(prefix)

    def max_step(self, until: float = float("inf")) -> int | None:
        seen = [s for t, s, _ in self.steps if t <= until]
        return max(seen) if seen else None

    def wait(self, cond, timeout_s: float, what: str, swarm: LocalSwarm):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            if (got := cond()) is not None:
                return got
            if not swarm.procs["coordinator"].alive():
                raise RuntimeError(f"the coordinator exited while waiting for {what}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {timeout_s:.0f} s:\n{self.tail()}")
            time.sleep(POLL_S)

    def tail(self, n: int = 40) -> str:
        return "\n".join(line for _, line in self.lines[-n:])


@dataclass
class Event:
    t: float
    victim: str
    victim_stage: int
    plan_epoch: int
    replicas_of_stage_left: int  # live placed replicas of the victim's stage after the kill
    joiner: str
    step_before: int | None


def start_peer(swarm: LocalSwarm, run: Path, name: str, log: CoordinatorLog) -> float:
    ident = Identity.load_or_create(run / name / "identity.pem")  # created here so its id is known up front
    log.known[ident.peer_id[:12]] = name
    swarm.start_peer(name)  # LocalSwarm gives it --state-dir run/<name>: a machine of its own
    return time.monotonic()


def run_swarm(
    root: Path,
    *,
    peers: int,
    duration: float,
    interval: float,
    seed: int,
    churn: bool,
    grace: float,
    ttl: float,
    step_timeout: float,
) -> dict:
    run = root / "run"
    job = root / "job.toml"
    job.parent.mkdir(parents=True, exist_ok=True)
    job.write_text(
        job_toml(
            "bench-churn",
            steps=10**6,
            ckpt=root / "coordinator-ckpt",
            interval=10**6,
            seed=seed,
            stages=2,
            max_replicas=max(1, peers // 2),
        )
    )
    rng = random.Random(seed)
    label = "churn" if churn else "baseline"
    peer_args = (*PEER_ARGS, "--ttl", str(ttl), "--step-timeout", str(step_timeout))
    swarm_id = f"bench-churn-{label}-{os.getpid()}"
    # -v: the peers' INFO lines say what state each transfer moved (FETCH_RE)
    with LocalSwarm(run, job, swarm_id=swarm_id, peer_args=peer_args, verbose=1) as swarm:
        t_launch = time.monotonic()
        swarm.start_coordinator()
        log = CoordinatorLog(swarm.procs["coordinator"].log)
        started: dict[str, float] = {}
        for i in range(peers):
            name = f"p{i:02d}"
            started[name] = start_peer(swarm, run, name, log)
        log.wait(lambda: log.steps[0] if log.steps else None, 300, "first step", swarm)
        t0, step0, _ = log.steps[0]
        first_plan = log.plans[0]
        print(
            f"[{label}] first step {step0} after {t0 - t_launch:.1f} s; plan epoch {first_plan.epoch}: "
            f"{first_plan.stages} x {first_plan.replicas}, {len(first_plan.spares)} spares",
            flush=True,
        )
        events: list[Event] = []
        next_kill = t0 + interval
        end = t0 + duration
        n_started = peers
        while (now := time.monotonic()) < end:
            log.poll()
            if not swarm.procs["coordinator"].alive():
                raise RuntimeError(f"the coordinator exited:\n{log.tail()}")
            if churn and now >= next_kill:
                next_kill += interval
                plan = log.plans[-1]
                live = {n for n, p in swarm.procs.items() if n != "coordinator" and p.alive()}
                placed = {log.known[p]: s for p, s in plan.placed.items() if log.known.get(p) in live}
                if not placed:
                    print(f"[{label}] {now - t0:6.1f} s: no live placed peer to kill; skipped", flush=True)
                    continue
                victim = rng.choice(sorted(placed))
                stage = placed[victim]
                left = sum(1 for s in placed.values() if s == stage) - 1
                before = log.max_step()
                t_kill = time.monotonic()
                swarm.stop(victim, signal.SIGKILL)
                joiner = f"p{n_started:02d}"
                n_started += 1
                started[joiner] = start_peer(swarm, run, joiner, log)
                events.append(Event(t_kill, victim, stage, plan.epoch, left, joiner, before))
                print(
                    f"[{label}] {t_kill - t0:6.1f} s: SIGKILL {victim} (stage {stage}, "
                    f"plan epoch {plan.epoch}, {left} replica(s) of its stage left, committed {before}); "
                    f"started {joiner}",
                    flush=True,
                )
            time.sleep(POLL_S)
        step_end = log.max_step(end)
        # Give the last kills a bounded time to recover; this time counts for nothing but their recovery.
        deadline = time.monotonic() + grace
        while events and time.monotonic() < deadline and any(_recovery(log, e) is None for e in events):
            log.poll()
            time.sleep(POLL_S)
        log.poll()
    fetches = read_fetches(run, {n for n in started}, time.time() - time.monotonic())
    return summarize(label, log, t0, step0, step_end, end, duration, events, started, peers, fetches)


@dataclass(frozen=True)
class Fetch:
    t: float  # monotonic seconds (converted from the line's wall-clock time)
    peer: str
    nbytes: int
    seconds: float


def read_fetches(run: Path, names: set[str], wall_minus_mono: float) -> list[Fetch]:
    """Every state transfer the peers logged (FETCH_RE), oldest first."""
    out = []
    for name in sorted(names):
        path = run / f"{name}.log"
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            m = FETCH_RE.match(line)
            if m is None:
                continue
            wall = (
                time.mktime(time.strptime(m.group(1)[:19], "%Y-%m-%d %H:%M:%S")) + int(m.group(1)[20:]) / 1e3
            )
            out.append(Fetch(wall - wall_minus_mono, name, int(m.group(2)), float(m.group(3))))
    return sorted(out, key=lambda f: f.t)


def _plan_after(log: CoordinatorLog, t: float) -> Plan | None:
    return next((p for p in log.plans if p.t >= t), None)


def _recovery(log: CoordinatorLog, e: Event) -> tuple[Plan, float, int] | None:
    """The first plan published after the kill and the first step line after it (time, step)."""
    plan = _plan_after(log, e.t)
    if plan is None:
        return None
    step = next(((t, s) for t, s, _ in log.steps if t >= plan.t), None)
    return None if step is None else (plan, step[0], step[1])


def summarize(
    label: str,
    log: CoordinatorLog,
    t0: float,
    step0: int,
    step_end: int | None,
    end: float,
    duration: float,
    events: list[Event],
    started: dict[str, float],
    initial: int,
    fetches: list[Fetch],
) -> dict:
    in_window = [(s, loss) for t, s, loss in log.steps if t <= end]
    out: dict = {
        "label": label,
        "step_first": step0,
        "step_end": step_end,
        "steps_per_s": round(((step_end or step0) - step0) / duration, 3),
        "loss_end": in_window[-1][1] if in_window else None,
        "losses": in_window,
        "plans": [
            {
                "epoch": p.epoch,
                "shape": f"{p.stages}x{p.replicas}",
                "from_step": p.start,
                "t": round(p.t - t0, 1),
            }
            for p in log.plans
        ],
    }
    rows = []
    for i, e in enumerate(events):
        until = events[i + 1].t if i + 1 < len(events) else float("inf")
        moved = [f for f in fetches if e.t <= f.t < until]
        nbytes, busy = sum(f.nbytes for f in moved), sum(f.seconds for f in moved)
        rec = _recovery(log, e)
        plan = _plan_after(log, e.t)
        lost = None if plan is None or e.step_before is None else max(0, e.step_before - plan.start)
        # The coordinator's view lags the swarm by its poll and the DHT: steps committed before the kill
        # can show up after it. The stricter count uses every step line printed before the new plan.
        seen = log.max_step(plan.t) if plan else None
        lost_seen = None if plan is None or seen is None else max(0, seen - plan.start)
        victim_id = next(p for p, n in log.known.items() if n == e.victim)
        rows.append(
            {
                "t": round(e.t - t0, 1),
                "victim": e.victim,
                "stage": e.victim_stage,
                "replicas_left": e.replicas_of_stage_left,
                "step_before": e.step_before,
                "new_epoch": plan.epoch if plan else None,
                "new_epoch_at_s": round(plan.t - e.t, 1) if plan else None,
                "from_step": plan.start if plan else None,
                "steps_lost": lost,
                "step_seen_before_plan": seen,
                "steps_lost_vs_seen_before_plan": lost_seen,
                "left_s": round(log.left[victim_id] - e.t, 1) if victim_id in log.left else None,
                "recovery_s": round(rec[1] - e.t, 1) if rec else None,
                "first_step_after": rec[2] if rec else None,
                "joiner": e.joiner,
                "state_bytes": nbytes,
                "state_mb_s": round(nbytes / busy / 1e6, 1) if busy > 0 else None,
            }
        )
    out["events"] = rows
    joins = []
    for name, t_start in started.items():
        if name in {f"p{i:02d}" for i in range(initial)}:
            continue
        prefix = next(p for p, n in log.known.items() if n == name)
        placing, step = first_committed_step(log, prefix, t_start)
        placed_in = [p.epoch for p in log.plans if p.t >= t_start and prefix in p.placed]
        mine = [f for f in fetches if f.peer == name]
        fetch_s = sum(f.seconds for f in mine)
        joins.append(
            {
                "peer": name,
                "seen_s": round(log.joined[prefix] - t_start, 1) if prefix in log.joined else None,
                "placed_epoch": placing.epoch if placing else None,
                "placed_in": placed_in,
                "first_step_s": round(step - t_start, 1) if step is not None else None,
                "state_bytes": sum(f.nbytes for f in mine),
                # 1.5 x (its state bytes / its download rate) + 60 s; no transfer: 60 s
                "target_s": round(1.5 * fetch_s + 60.0, 1),
                # issue 38's tighter bound on the same figure: + 20 s of start-up, not 60
                "useful_target_s": round(1.5 * fetch_s + 20.0, 1),
                "why_not": None
                if step is not None
                else (
                    "no plan placed it before the end (spare, or no re-plan since it joined)"
                    if not placed_in
                    else f"placed in epoch(s) {placed_in}, but no step was committed while it was placed"
                ),
            }
        )
    out["joins"] = joins
    return out


def first_committed_step(
    log: CoordinatorLog, prefix: str, t_start: float
) -> tuple[Plan | None, float | None]:
    """The first plan after ``t_start`` that places the peer and under which a step line was printed
    (before the next plan), with that line's time; (None, None) when there is none."""
    for i, plan in enumerate(log.plans):
        if plan.t < t_start or prefix not in plan.placed:
            continue
        until = log.plans[i + 1].t if i + 1 < len(log.plans) else float("inf")
        t = next((t for t, _, _ in log.steps if plan.t <= t < until), None)
        if t is not None:
            return plan, t
    return None, None


def loss_at(run: dict, step: int) -> tuple[int, float] | None:
    """The printed (step, loss) of ``run`` at ``step``, or the nearest printed step below it."""
    below = [(s, loss) for s, loss in run["losses"] if s <= step]
    return max(below) if below else None


def mean_loss(run: dict, lo: int, hi: int) -> float | None:
    vals = [loss for s, loss in run["losses"] if lo < s <= hi]
    return round(statistics.fmean(vals), 4) if vals else None


def report(base: dict, churn: dict, args: argparse.Namespace) -> dict:
    events = churn["events"]
    rec = [e["recovery_s"] for e in events if e["recovery_s"] is not None]
    lost = [e["steps_lost"] for e in events if e["steps_lost"] is not None]
    joins_s = [j["first_step_s"] for j in churn["joins"] if j["first_step_s"] is not None]
    k = churn["step_end"] or churn["step_first"]
    b = loss_at(base, k)
    mc, mb = mean_loss(churn, k - LOSS_WINDOW, k), mean_loss(base, k - LOSS_WINDOW, k)
    summary = {
        "peers": args.peers,
        "duration_s": args.duration,
        "interval_s": args.interval,
        "seed": args.seed,
        "ttl_s": args.ttl,
        "step_timeout_s": args.step_timeout,
        "steps_per_s_baseline": base["steps_per_s"],
        "steps_per_s_churn": churn["steps_per_s"],
        "throughput_retained": round(churn["steps_per_s"] / base["steps_per_s"], 3)
        if base["steps_per_s"]
        else None,
        "events": len(events),
        "recovered": len(rec),
        "recovery_s": [e["recovery_s"] for e in events],
        "recovery_s_median": round(statistics.median(rec), 1) if rec else None,
        "recovery_s_max": max(rec) if rec else None,
        "steps_lost": sum(lost),
        "steps_lost_per_event": [e["steps_lost"] for e in events],
        "steps_lost_vs_seen_before_plan": [e["steps_lost_vs_seen_before_plan"] for e in events],
        "left_s": [e["left_s"] for e in events],
        "replan_s": [e["new_epoch_at_s"] for e in events],
        "churn_step_end": k,
        "churn_loss_end": churn["loss_end"],
        "baseline_step_compared": b[0] if b else None,
        "baseline_loss_at_step": b[1] if b else None,
        "loss_diff_point": round(churn["loss_end"] - b[1], 4)
        if b and churn["loss_end"] is not None
        else None,
        "loss_mean_churn": mc,
        "loss_mean_baseline": mb,
        "loss_diff": round(mc - mb, 4) if mc is not None and mb is not None else None,
        "loss_window": f"steps {k - LOSS_WINDOW + 1}-{k}",
        # time to first useful step (issue 38): from a joiner's start to the first step committed with it
        # placed, against 1.5 x (its state bytes / its downlink, as its fetches measured it) + 20 s
        "first_useful_step_s": [j["first_step_s"] for j in churn["joins"]],
        "first_useful_step_s_median": round(statistics.median(joins_s), 1) if joins_s else None,
        "first_useful_step_target_s": [j["useful_target_s"] for j in churn["joins"]],
        "first_useful_within_target": sum(
            1
            for j in churn["joins"]
            if j["first_step_s"] is not None and j["first_step_s"] <= j["useful_target_s"]
        ),
        "join_s": [j["first_step_s"] for j in churn["joins"]],
        "join_s_max": max(joins_s) if joins_s else None,
        "join_target_s": [j["target_s"] for j in churn["joins"]],
        "joins_within_target": sum(
            1 for j in churn["joins"] if j["first_step_s"] is not None and j["first_step_s"] <= j["target_s"]
        ),
        "state_bytes_per_event": [e["state_bytes"] for e in events],
        "state_mb_s_per_event": [e["state_mb_s"] for e in events],
        "joins_not_measured": [f"{j['peer']}: {j['why_not']}" for j in churn["joins"] if j["why_not"]],
        "plans_churn": churn["plans"],
        "plans_baseline": base["plans"],
        "per_event": events,
        "joins": churn["joins"],
        "run_dir": str(args.run_dir),
    }
    return summary


def print_human(s: dict) -> None:
    print(
        f"\nchurn: {s['peers']} peers, {s['duration_s']:.0f} s, "
        f"a kill every {s['interval_s']:.0f} s, seed {s['seed']}"
    )
    print(
        f"throughput: {s['steps_per_s_churn']} steps/s with churn, {s['steps_per_s_baseline']} without: "
        f"retained {s['throughput_retained']} (target >= 0.8)"
    )
    print(f"events: {s['events']}, recovered within the run: {s['recovered']}")
    for e in s["per_event"]:
        print(
            f"  {e['t']:6.1f} s  kill {e['victim']} (stage {e['stage']}, {e['replicas_left']} left)  "
            f"committed {e['step_before']}  left after {e['left_s']} s  "
            f"-> epoch {e['new_epoch']} after {e['new_epoch_at_s']} s "
            f"from step {e['from_step']} (seen {e['step_seen_before_plan']})  lost {e['steps_lost']}  "
            f"recovery {e['recovery_s']} s  state moved {e['state_bytes'] / 1e6:.1f} MB at "
            f"{e['state_mb_s']} MB/s  (joiner {e['joiner']})"
        )
    print(
        f"recovery: median {s['recovery_s_median']} s, max {s['recovery_s_max']} s (target median <= 10 s); "
        f"steps lost: {s['steps_lost']} in all"
    )
    print(
        f"loss, mean of the lines over {s['loss_window']}: {s['loss_mean_churn']} with churn, "
        f"{s['loss_mean_baseline']} without: diff {s['loss_diff']}; "
        f"at churn's last step {s['churn_step_end']}: "
        f"{s['churn_loss_end']} vs baseline {s['baseline_loss_at_step']} (its nearest step "
        f"{s['baseline_step_compared']})"
    )
    for j in s["joins"]:
        seen = f"seen by the coordinator after {j['seen_s']} s, " if j["seen_s"] is not None else ""
        first = (
            f"first committed step after {j['first_step_s']} s (target {j['target_s']} s)"
            if j["first_step_s"] is not None
            else j["why_not"]
        )
        print(f"  joiner {j['peer']}: {seen}{first}")
    print(f"logs: {s['run_dir']}", flush=True)


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through LocalSwarm's close(): every process stopped and reaped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of training measured per run")
    ap.add_argument("--interval", type=float, default=30.0, help="seconds between kills")
    ap.add_argument("--peers", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0, help="job seed and victim choice")
    ap.add_argument("--ttl", type=float, default=15.0, help="peers' heartbeat lifetime (as in test_churn)")
    ap.add_argument(
        "--step-timeout", type=float, default=5.0, help="peers' --step-timeout (as in test_churn)"
    )
    ap.add_argument("--grace", type=float, default=30.0, help="extra seconds for the last kill to recover")
    ap.add_argument("--run-dir", type=Path, default=None, help="keep logs here (default: a temp dir)")
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    args = ap.parse_args()
    if args.peers < 3:
        ap.error("--peers must be at least 3 (2 stages, and a peer to kill)")
    args.run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="potluck-churn-"))
    os.environ.setdefault("COLUMNS", "200")  # the plan tables on one line each in the coordinator's log
    signal.signal(signal.SIGTERM, _sigterm)
    common = dict(
        peers=args.peers,
        duration=args.duration,
        interval=args.interval,
        seed=args.seed,
        ttl=args.ttl,
        step_timeout=args.step_timeout,
    )
    try:
        churn = run_swarm(args.run_dir / "churn", churn=True, grace=args.grace, **common)
        base = run_swarm(args.run_dir / "baseline", churn=False, grace=0.0, **common)
    except KeyboardInterrupt:
        print("interrupted; every process stopped", file=sys.stderr)
        return 130
    summary = report(base, churn, args)
    print_human(summary)
    if args.json:
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
