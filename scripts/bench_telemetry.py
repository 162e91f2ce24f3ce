#!/usr/bin/env python3
"""Telemetry benchmarks: what telemetry costs a training step, and that a broker dying mid-run costs
nothing; plus the cost of sealing and checking one message.

The demo's job (2 stages x 2 replicas, 4 peer processes on loopback) runs three times, the same seed
and steps: telemetry off; telemetry on (embedded broker, dashboard, peers publishing every second); and
telemetry on an external mosquitto that is SIGKILLed a third of the way in. Step times are each peer's
own (its progress records' timing, every step it reported), so start-up is not counted.

    python scripts/bench_telemetry.py [--steps 300] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from potluck.cli.demo_cmd import run_local_job
from potluck.cli.telemetry_opts import TelemetryOptions
from potluck.protocol.identity import Identity
from potluck.protocol.telemetry import VERSION, PeerMetrics, open_message, peer_topic, seal_message
from potluck.testbed.demojob import demo_job

MOSQUITTO = next((p for p in ("/usr/sbin/mosquitto", "/usr/bin/mosquitto") if os.path.exists(p)), None)


def bench_messages(n: int = 2000) -> dict[str, float]:
    peer = Identity.generate()
    m = PeerMetrics(v=VERSION, peer=peer.peer_id, at=time.time(), state="contributing", step=100, loss=1.0)
    t = time.perf_counter()
    payloads = [seal_message(peer, m) for _ in range(n)]
    seal_s = time.perf_counter() - t
    topic = peer_topic("bench", peer.peer_id, "metrics")
    t = time.perf_counter()
    for p in payloads:
        open_message(topic, p, "bench")
    open_s = time.perf_counter() - t
    return {
        "seal_per_s": round(n / seal_s),
        "open_per_s": round(n / open_s),
        "metrics_bytes": len(payloads[0]),
    }


def step_times(watcher) -> list[float]:  # type: ignore[no-untyped-def]
    """Every step's total time as each peer reported it (all peers, all steps)."""
    return [t.total for per in watcher.timings.values() for t in per.values() if t.total > 0]


async def one_run(name: str, steps: int, opts: TelemetryOptions, kill_after_s: float | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench-tel-{name}-") as tmp:
        run = Path(tmp)
        job = demo_job(steps, run / "checkpoints")
        broker: subprocess.Popen[bytes] | None = None
        if opts.mqtt_url == "mosquitto":
            assert MOSQUITTO is not None, "mosquitto is not installed"
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            conf = run / "mosquitto.conf"
            conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
            broker = subprocess.Popen(
                [MOSQUITTO, "-c", str(conf)], stderr=subprocess.DEVNULL, start_new_session=True
            )
            time.sleep(0.5)
            opts = TelemetryOptions(True, f"mqtt://127.0.0.1:{port}", dashboard_bind="127.0.0.1:0")
        killed_at: list[float] = []

        async def kill_broker() -> None:
            assert broker is not None and kill_after_s is not None
            await asyncio.sleep(kill_after_s)
            os.killpg(broker.pid, signal.SIGKILL)
            killed_at.append(kill_after_s)

        killer = asyncio.create_task(kill_broker()) if broker is not None and kill_after_s else None
        t0 = time.perf_counter()
        try:
            summary, watcher = await run_local_job(job, run, 1800.0, 1, opts)
        finally:
            if killer is not None:
                killer.cancel()
            if broker is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(broker.pid, signal.SIGKILL)
                broker.wait(timeout=10)
        times = step_times(watcher)
        return {
            "variant": name,
            "seconds": round(time.perf_counter() - t0, 1),
            "steps": summary["steps"],
            "tokens_per_s": summary["tokens_per_s"],
            "step_s_median": round(statistics.median(times), 4),
            "step_s_p90": round(statistics.quantiles(times, n=10)[-1], 4),
            "step_samples": len(times),
            "broker_killed_at_s": killed_at[0] if killed_at else None,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict[str, object] = {"messages": bench_messages()}
    runs = [
        ("off", TelemetryOptions(enabled=False)),
        ("embedded", TelemetryOptions(True, dashboard_bind="127.0.0.1:0")),
    ]
    if MOSQUITTO is not None and shutil.which(MOSQUITTO):
        runs.append(("mosquitto-killed", TelemetryOptions(True, "mosquitto")))
    results = []
    for name, opts in runs:
        kill = 45.0 if name == "mosquitto-killed" else None  # start-up takes ~25 s: mid-training
        results.append(asyncio.run(one_run(name, args.steps, opts, kill)))
        print(f"[{name}] {results[-1]}", flush=True)
    out["runs"] = results
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
