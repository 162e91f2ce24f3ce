#!/usr/bin/env python3
"""Loopback smoke run of the hivemind baseline: N ``scripts/wan_hivemind.py`` workers on 127.0.0.1.

Starts peer 0, reads its multiaddrs, starts the others bootstrapped to it, waits for every worker (each
one a process group of its own, killed by PID on exit, Ctrl-C or failure, and dying with this process
anyway: PR_SET_PDEATHSIG), then prints one JSON line: ``scripts/wan_hivemind.py:swarm_summary`` of the
workers' records (swarm tokens/s, loss per epoch, bytes of the p2p daemons) plus the run's settings.

    python scripts/wan_hivemind_local.py --peers 3 --epochs 300 --compression fp16

Worker logs and records stay in ``--run-dir`` (a temporary directory by default, printed on stderr).

Measured on the 2-core box (demo job, fp16, defaults: matchmaking 2 s, parameters averaged every epoch,
one torch thread per worker, other work on the machine too):

- 3 peers, 100 epochs: 263 s of training (2.6 s an epoch: matchmaking sets the pace, compute is ~0.1 s
  per peer), loss 5.56 -> 0.63 (potluck's single-process reference, same job, 100 steps: 0.66);
  gradients averaged by all 3 peers on 98% of peer-epochs, 2 resyncs; 15.9 MB sent per epoch by the
  swarm (5.3 MB a peer: fp16 gradients and parameters, 1.84 MB each).
- 4 peers, 300 epochs: 878 s (2.9 s an epoch), loss 5.57 -> 0.58 (reference 0.61); 98% full groups, 5
  resyncs; 24 MB per epoch (6 MB a peer). 700 tokens/s counted as potluck counts (epochs x 2,048), but
  the peers computed 98 sequences an epoch for a target of 32 (hivemind learns that an epoch is full
  only at its next progress refresh, >= 0.5 s, and these epochs need ~0.3 s of compute): 2,135
  computed tokens/s, and loss 0.645 after 614 k computed tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
for p in (ROOT, SCRIPTS):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from wan_hivemind import COMPRESSIONS, HivemindSettings, read_records, swarm_summary  # noqa: E402

from potluck import lifeline  # noqa: E402

logger = logging.getLogger(__name__)

WORKER = SCRIPTS / "wan_hivemind.py"
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
            cwd=ROOT,
        )
        lifeline.after_spawn(self.proc.pid, signal.SIGKILL, group=True)

    def read_maddrs(self, timeout_s: float) -> list[str]:
        """The first JSON line the worker prints (``--print-maddrs``)."""
        import selectors

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
    cmd = [
        sys.executable,
        str(WORKER),
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = HivemindSettings()
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        summary = run(args)
    except KeyboardInterrupt:
        logger.error("interrupted; workers stopped")
        return 130
    except RuntimeError as e:
        logger.error("%s", e)
        return 1
    if not args.curve:
        summary.pop("curve", None)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
