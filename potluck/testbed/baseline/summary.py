"""The hivemind baseline swarm's figures, from every peer's records (``worker.py --out``): per epoch the
exact tokens, the sample-weighted loss and the bytes, and the swarm's tokens/s. ``local.py`` and
``scripts/bench_wan.py`` report these."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any


def read_records(path: Path) -> list[dict[str, Any]]:
    """One worker's JSON-lines records (``--out``); a torn last line or a missing file reads as fewer."""
    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


def swarm_summary(records: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """The swarm's view from every peer's records: per epoch the exact tokens (sum of the peers'
    ``tokens_local``), the sample-weighted loss and the bytes; tokens/s from the first "start" to the
    last epoch record."""
    epochs: dict[int, list[dict[str, Any]]] = {}
    for peer in records:
        for r in peer:
            if r.get("event") == "epoch":
                epochs.setdefault(int(r["trained_epoch"]), []).append(r)
    starts = [r["time"] for peer in records for r in peer if r.get("event") == "start"]
    done = [r for peer in records for r in peer if r.get("event") == "done"]
    n = len(records)
    curve = []
    for e in sorted(epochs):
        rs = epochs[e]
        samples = sum(r["samples"] for r in rs)
        curve.append(
            {
                "epoch": e,
                "peers": len(rs),
                "tokens": sum(r["tokens_local"] for r in rs),
                "samples": samples,
                "loss": sum(r["loss"] * r["samples"] for r in rs) / max(1, samples),
                "time": max(r["time"] for r in rs),
            }
        )
    complete = [c for c in curve if c["peers"] == n]
    t0 = min(starts) if starts else None
    last = complete[-1] if complete else None
    seconds = (last["time"] - t0) if last and t0 is not None else None

    def total(key: str) -> int | None:
        vals = [r["bytes"].get(key) for r in done]
        return None if not vals or any(v is None for v in vals) else int(sum(vals))

    epoch_records = [r for rs in epochs.values() for r in rs]
    per_step = next(
        (int(r["tokens_per_step"]) for peer in records for r in peer if r.get("event") == "start"), 0
    )
    nominal = (last["epoch"] + 1) * per_step if last else 0
    full = [r.get("grad_group") == n for r in epoch_records]
    tail = complete[-5:]
    sent = total("p2pd_sent")
    return {
        "peers": n,
        "peers_done": len(done),
        "epochs": last["epoch"] + 1 if last else 0,
        # tokens: what the peers computed (hivemind overshoots target_batch_size while the news that an
        # epoch is full travels); nominal: epochs x the job's tokens_per_step, potluck's count per step
        "tokens": last["tokens"] if last else 0,
        "tokens_nominal": nominal,
        "seconds": round(seconds, 2) if seconds is not None else None,
        "tokens_per_s": round(last["tokens"] / seconds, 1) if last and seconds else None,
        "tokens_per_s_nominal": round(nominal / seconds, 1) if nominal and seconds else None,
        "seconds_per_epoch": round(seconds / (last["epoch"] + 1), 3) if last and seconds else None,
        "samples_per_epoch_mean": round(sum(c["samples"] for c in complete) / len(complete), 2)
        if complete
        else None,
        "loss_first": round(complete[0]["loss"], 4) if complete else None,
        "loss_last": round(last["loss"], 4) if last else None,
        "loss_last5_mean": round(sum(c["loss"] for c in tail) / len(tail), 4) if tail else None,
        "final_epochs": sorted({r["epoch"] for r in done}),
        # hivemind's health: the share of peer-epochs whose gradients were averaged by all n peers
        # (its docs: raise matchmaking_time when under 0.9 n on >= 25% of epochs), local fallbacks, and
        # resyncs (full-state downloads) of peers that fell behind
        "full_group_share": round(sum(full) / len(full), 3) if full else None,
        "local_fallbacks": sum(r.get("local_fallback", 0) for r in epoch_records),
        "resyncs": sum(r.get("resync", 0) for r in epoch_records),
        "bytes_sent": sent,
        "bytes_recv": total("p2pd_recv"),
        "bytes_sent_per_epoch": round(sent / (last["epoch"] + 1)) if last and sent is not None else None,
        "curve": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in c.items()} for c in curve],
    }
