"""Loopback smoke run of the hivemind baseline: N ``scripts/wan_hivemind.py`` workers on 127.0.0.1.

Starts peer 0 (``python -m potluck.testbed.baseline.worker``, the same program as
``scripts/wan_hivemind.py``), reads its multiaddrs, starts the others bootstrapped to it, waits for every
worker (each one a process group of its own, killed by PID on exit, Ctrl-C or failure, and dying with
this process anyway: PR_SET_PDEATHSIG), and returns ``summary.swarm_summary`` of the workers' records
plus the run's settings. ``scripts/wan_hivemind_local.py`` prints it; the integration test reads it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from potluck import lifeline
from potluck.testbed.baseline.settings import COMPRESSIONS, HivemindSettings
from potluck.testbed.baseline.summary import read_records, swarm_summary

logger = logging.getLogger(__name__)

WORKER = (sys.executable, "-m", "potluck.testbed.baseline.worker")
MADDRS_TIMEOUT_S = 120.0  # the first worker's imports, dataset, model and p2p daemon


class Worker:
    """One worker process in its own session (its forked children and p2pd share its process group)."""

    def __init__(self, index: int, cmd: list[str], log: Path) -> None:
        self.index, self.log_path = index, log
        self._log: IO[bytes] = open(log, "wb")  # noqa: SIM115 (closed in close())
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=lifeline.preexec(signal.SIGKILL),
            env=env,
        )
        lifeline.after_spawn(self.proc.pid, signal.SIGKILL, group=True)

    def read_maddrs(self, timeout_s: float) -> list[str]:
        """The first JSON line the worker prints (``--print-maddrs``)."""
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        buf = b""
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, min(1.0, deadline - time.monotonic()))):
                if self.proc.poll() is not None:
                    break
                continue
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            if b"\n" in buf:
                return list(json.loads(buf.split(b"\n", 1)[0])["maddrs"])
        raise RuntimeError(f"worker {self.index} printed no multiaddrs; log {self.log_path}:\n{self.tail()}")

    def tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def kill(self) -> None:
        """SIGTERM the worker's process group, SIGKILL after 3 s, then reap."""
        for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            if self.proc.poll() is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)  # leftovers of an exited worker's group
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(wait_s)
        self.close()

    def close(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


def worker_cmd(args: argparse.Namespace, index: int, out: Path, boot: list[str]) -> list[str]:
    """Worker ``index``'s command line; the first (no ``boot``) prints its multiaddrs for the others."""
    cmd = [
        *WORKER,
        "--host",
        "127.0.0.1",
        "--peer-index",
        str(index),
        "--n-peers",
        str(args.peers),
        "--compression",
        args.compression,
        "--threads",
        str(args.threads),
        "--out",
        str(out),
        "--matchmaking-time",
        str(args.matchmaking_time),
        "--averaging-timeout",
        str(args.averaging_timeout),
        "--average-state-every",
        str(args.average_state_every),
        "--timeout",
        str(args.timeout),
        "--run-id",
        args.run_id,
    ]
    cmd += ["--tokens", str(args.tokens)] if args.tokens else ["--epochs", str(args.epochs)]
    if args.seconds:
        cmd += ["--seconds", str(args.seconds)]
    if args.delay_updates:
        cmd.append("--delay-updates")
    if args.job:
        cmd += ["--job", str(args.job)]
    if boot:
        cmd += ["--initial-peers", *boot]
    else:
        cmd.append("--print-maddrs")
    return cmd


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the swarm, wait for it, return the summary (raises on a worker failure or a timeout)."""
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="wan-hivemind-")).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    logger.info("logs and records in %s", run_dir)
    outs = [run_dir / f"peer{i}.jsonl" for i in range(args.peers)]
    workers: list[Worker] = []
    started = time.monotonic()
    try:
        first = Worker(0, worker_cmd(args, 0, outs[0], []), run_dir / "peer0.log")
        workers.append(first)
        boot = first.read_maddrs(MADDRS_TIMEOUT_S)
        for i in range(1, args.peers):
            workers.append(Worker(i, worker_cmd(args, i, outs[i], boot), run_dir / f"peer{i}.log"))
        deadline = started + args.timeout + 60
        while True:  # the first worker to fail ends the run (the others would wait on it for minutes)
            codes = [w.proc.poll() for w in workers]
            for w, code in zip(workers, codes, strict=True):
                if code not in (None, 0):
                    raise RuntimeError(f"worker {w.index} exited {code}; log {w.log_path}:\n{w.tail()}")
            if all(code == 0 for code in codes):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers still running after {args.timeout:.0f} s")
            time.sleep(0.5)
    finally:
        for w in workers:
            w.kill()
    summary = swarm_summary([read_records(p) for p in outs])
    summary["wall_s"] = round(time.monotonic() - started, 1)
    summary["run_dir"] = str(run_dir)
    summary["settings"] = {
        "compression": args.compression,
        "threads": args.threads,
        "matchmaking_time": args.matchmaking_time,
        "averaging_timeout": args.averaging_timeout,
        "average_state_every": args.average_state_every,
        "delay_updates": args.delay_updates,
    }
    return summary


def parse_args(argv: list[str] | None = None, doc: str | None = None) -> argparse.Namespace:
    """The loopback run's command line (``scripts/wan_hivemind_local.py``'s); ``doc``'s first line
    describes it."""
    d = HivemindSettings()
    ap = argparse.ArgumentParser(description=(doc or __doc__ or "").splitlines()[0])
    ap.add_argument("--peers", type=int, default=3)
    limit = ap.add_mutually_exclusive_group()
    limit.add_argument("--epochs", type=int, default=50, help="optimizer epochs (potluck steps)")
    limit.add_argument("--tokens", type=int, help="instead of --epochs: tokens / job tokens_per_step epochs")
    ap.add_argument("--seconds", type=float, help="also stop each worker after this many seconds of training")
    ap.add_argument("--compression", choices=COMPRESSIONS, default="fp16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--matchmaking-time", type=float, default=d.matchmaking_time)
    ap.add_argument("--averaging-timeout", type=float, default=d.averaging_timeout)
    ap.add_argument("--average-state-every", type=int, default=d.average_state_every)
    ap.add_argument("--delay-updates", action="store_true")
    ap.add_argument("--job", type=Path, help="a potluck job TOML (default: the demo job)")
    ap.add_argument("--run-id", default="potluck-wan-hivemind-local")
    ap.add_argument("--run-dir", type=Path, help="keep logs and records here")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds, per worker (hard)")
    ap.add_argument("--curve", action="store_true", help="keep the per-epoch curve in the JSON")
    args = ap.parse_args(argv)
    if args.peers < 2:
        ap.error("--peers must be at least 2")
    return args
