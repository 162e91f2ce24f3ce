"""Replay a real loopback chaos run (``scripts/bench_churn.py``) in the simulator and compare.

Inputs taken from the run: its kill times and the stage of each victim, its TTL, its baseline rate
(steps/s without churn: the loopback CPU step time is a calibration input, not something the GPU cost
model predicts) and the median state transfer rate it measured on loopback. Everything else is the
simulator's model, as in a swarm-scale run: detection (``fast_detect_share`` of crashes noticed in
``fast_detect_s``, the rest when the heartbeat record expires), the coordinator's poll, the real
``placement.plan`` repairing the previous plan (its decision time measured), the hand-off of the
bytes the cost model says each moved peer needs, and a restart (start barrier, first step).

Not modelled, and named in the result: plan epochs that only place a joiner (the real coordinator
places newcomers in their own epoch), and the CPU a joiner's start-up takes from the training peers
on a shared 2-core box (docs/benchmarks.md, "Churn": ~20 points lost outside recoveries).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from potluck.coordinator.placement import PlannerConfig, PlanningState, plan
from potluck.coordinator.placement.costmodel import BatchSpec, DeviceSpec, ModelShape, StepJob
from potluck.coordinator.placement.netmodel import from_matrices
from potluck.coordinator.placement.repair import state_bytes_per_peer
from potluck.sim.coordinator import stage_map
from potluck.sim.errors import SimError

logger = logging.getLogger(__name__)

TRACES = Path(__file__).parent / "traces"
REFERENCE_RUN = TRACES / "loopback-churn-p.json"


def load_run(path: Path = REFERENCE_RUN) -> dict[str, Any]:
    try:
        run: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SimError(f"{path}: {type(exc).__name__}: {exc}") from exc
    for key in ("kills", "duration_s", "ttl_s", "steps_per_s_baseline", "steps_per_s_churn", "job"):
        if key not in run:
            raise SimError(f"{path}: no {key!r}: not a bench_churn.py --json summary")
    return run


def _state(names: list[str], mb_s: float) -> PlanningState:
    n = len(names)
    lat = np.full((n, n), 0.05)  # loopback, ms one way
    bw = np.full((n, n), mb_s * 8.0 / 1e3)  # Gbit/s
    np.fill_diagonal(lat, 0.0)
    devices = tuple(DeviceSpec(0.05, 4.0) for _ in names)  # equal CPU peers (--threads 1)
    return PlanningState(tuple(names), devices, from_matrices(lat, bw))


def replay(
    run: dict[str, Any],
    fast_detect_share: float = 0.3,
    fast_detect_s: float = 1.0,
    poll_s: float = 1.0,
    restart_s: float = 2.0,
) -> dict[str, Any]:
    """Predicted steps/s under the run's kills, next to the measured ones."""
    j = run["job"]
    model = ModelShape(j["n_layers"], j["d_model"], j["n_heads"], j["vocab_size"], j["seq_len"])
    job = StepJob(model, BatchSpec(max(1, j["tokens_per_step"] // j["seq_len"]), j["micro_batch_size"]))
    cfg = PlannerConfig(stages=j["stages"], max_replicas=j["max_replicas"], time_limit_s=1.0)
    mb_s = float(np.median(run["state_mb_s_per_event"])) if run.get("state_mb_s_per_event") else 60.0
    ttl = float(run["ttl_s"])
    refresh = ttl / 3.0  # peers refresh their heartbeat three times per TTL
    detect = fast_detect_share * fast_detect_s + (1.0 - fast_detect_share) * (ttl - refresh / 2.0)
    live = [f"p{k:02d}" for k in range(int(run["peers"]))]
    current, _ = plan(_state(live, mb_s), job, 0.0, None, cfg)
    if current is None:
        raise SimError("the replayed job has no plan on the run's peers")
    stalls, decisions, moved_all = [], [], []
    for kill in run["kills"]:
        row = current.stages[min(int(kill["stage"]), current.n_stages - 1)]
        victim = str(row[0])
        live = [p for p in live if p != victim]
        t0 = time.perf_counter()
        new, reason = plan(_state(live, mb_s), job, float(kill["t"]), current, cfg)
        decision_s = time.perf_counter() - t0
        if new is None:
            raise SimError(f"no plan after the kill at {kill['t']} s: {reason}")
        before, after = stage_map(current), stage_map(new)
        moved = sum(1 for p, s in after.items() if before.get(p) != s)
        per_peer = state_bytes_per_peer(job, new.n_stages)
        handoff = per_peer / (mb_s * 1e6) if moved else 0.0
        stalls.append(detect + poll_s + decision_s + handoff + restart_s)
        decisions.append(decision_s)
        moved_all.append(moved)
        live.append(str(kill["joiner"]))  # the joiner is a spare until a later repair takes it
        current = new
    duration = float(run["duration_s"])
    base = float(run["steps_per_s_baseline"])
    predicted = base * max(duration - sum(stalls), 0.0) / duration
    measured = float(run["steps_per_s_churn"])
    return {
        "measured_steps_per_s": measured,
        "predicted_steps_per_s": round(predicted, 3),
        "error": round(predicted / measured - 1.0, 4),
        "predicted_stall_s": [round(s, 2) for s in stalls],
        "measured_recovery_s": run.get("recovery_s", []),
        "predicted_stall_total_s": round(sum(stalls), 1),
        "measured_recovery_total_s": round(sum(run.get("recovery_s", [])), 1),
        "decision_s_max": round(max(decisions), 4),
        "moved_per_kill": moved_all,
        "detect_mean_s": round(detect, 2),
        "fast_detect_share": fast_detect_share,
        "not_modelled": "joiner-only plan epochs; joiners' CPU start-up on the shared box",
    }
