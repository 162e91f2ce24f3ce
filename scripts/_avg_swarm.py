"""The driver's side of scripts/bench_vs_hivemind.py: the peer processes in their namespaces (PeerProc), the
CPU they use (session_cpu, cpu_busy), and the Swarm that starts them, sends "go" and collects results."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _avg_plans import Plans

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "scripts" / "bench_vs_hivemind.py"  # each peer is this script run with --worker


class PeerProc:
    """A worker process inside a namespace; its own session, so its process group is killed by PID."""

    def __init__(self, cmd: list[str], log: Path, extra_env: dict[str, str]) -> None:
        self.log_path = log
        self._log = open(log, "w")  # noqa: SIM115 (closed in kill)
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra_env)
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
            start_new_session=True,
            env=env,
            cwd=ROOT,
        )
        self._offset = 0
        self.replies: queue.Queue[tuple[float, dict[str, Any] | None]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(json.JSONDecodeError):
                self.replies.put((time.perf_counter(), json.loads(line)))
        self.replies.put((time.perf_counter(), None))

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float) -> tuple[float, dict[str, Any]]:
        try:
            at, msg = self.replies.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(
                f"no reply within {timeout:.0f} s; log {self.log_path}:\n{self.tail()}"
            ) from None
        if msg is None:
            raise RuntimeError(f"peer exited ({self.proc.poll()}); log {self.log_path}:\n{self.tail()}")
        if msg.get("event") == "error":
            raise RuntimeError(f"peer error: {msg['error']}; log {self.log_path}:\n{self.tail()}")
        return at, msg

    def new_warnings(self) -> list[str]:
        """Warning/error lines the peer (and its hivemind processes) logged since the last call."""
        try:
            with open(self.log_path, errors="replace") as f:
                f.seek(self._offset)
                text = f.read()
                self._offset = f.tell()
        except OSError:
            return []
        keep = ("[WARN]", "[ERROR]", "Error", "Exception", "Traceback")
        skip = "request_timeout smaller than min_matchmaking_time"  # our setting; harmless
        return [line for line in text.splitlines() if any(k in line for k in keep) and skip not in line]

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def signal_group(self, sig: int) -> bool:
        """Signal the worker's own process group (it, its DHT and averager processes, their p2pd)."""
        try:
            os.killpg(self.proc.pid, sig)
            return True
        except ProcessLookupError:
            return False


def session_cpu(sessions: set[int]) -> float:
    """CPU seconds (user + system) used so far by every live process in these sessions (our peers)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) in sessions:  # field 6 (session), counted after "pid (comm)"
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def cpu_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [float(v) for v in f.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


class Swarm:
    def __init__(self, lab: Any, args: argparse.Namespace, logdir: Path) -> None:
        self.lab, self.args, self.logdir = lab, args, logdir
        self.peers: list[PeerProc] = []
        self.round = 0

    def _spawn(self, i: int, boot: list[str]) -> PeerProc:
        a = self.args
        cmd = [
            *self.lab.exec_prefix(i),
            sys.executable,
            str(BENCH),
            "--worker",
            "--index",
            str(i),
            "--n",
            str(self.lab.n),
            "--addr",
            self.lab.addrs[i],
            "--elements",
            str(a.elements),
            "--data-seed",
            str(a.data_seed),
            "--chunk",
            str(a.chunk),
            "--timeout",
            str(a.timeout),
            "--matchmaking-s",
            str(a.matchmaking_s),
            "--boot",
            json.dumps(boot),
        ]
        env = {"HIVEMIND_LOGLEVEL": "DEBUG"} if a.hivemind_debug else {}
        return PeerProc(cmd, self.logdir / f"n{self.lab.n}-peer{i}.log", env)

    def start(self) -> None:
        self.peers.append(self._spawn(0, []))
        _, first = self.peers[0].recv(180)
        ups = [first]
        self.peers.extend(self._spawn(i, first["maddrs"]) for i in range(1, self.lab.n))
        ups.extend(p.recv(180)[1] for p in self.peers[1:])
        info = [{"peer_id": u["peer_id"], "maddrs": u["maddrs"]} for u in ups]
        for p in self.peers:
            p.send(op="connect", peers=info)
        for p in self.peers:
            p.recv(60)

    def stop(self, graceful: bool) -> None:
        """Graceful: ask every peer to quit and give them 20 s together. Then (or at once when not
        graceful) SIGTERM every peer's process group, then SIGKILL whatever is left, and reap."""
        if graceful:
            for p in self.peers:
                if p.proc.poll() is None:
                    with contextlib.suppress(BrokenPipeError, OSError, ValueError):
                        p.send(op="quit")
            deadline = time.monotonic() + 20
            for p in self.peers:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for sig, pause in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0.5)):
            if any([p.signal_group(sig) for p in self.peers]):
                time.sleep(pause)
        for p in self.peers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.proc.wait(timeout=5)
            p._log.close()
        self.peers.clear()

    def hivemind(self, plans: Plans, timeout: float) -> dict[str, Any]:
        t0 = time.perf_counter()
        for i, p in enumerate(self.peers):
            bw = None if plans.hm_bandwidth is None else plans.hm_bandwidth[i]
            p.send(op="hm_match", bandwidth=bw, timeout=self.args.matchmaking_s + 60.0)
        matched = [p.recv(self.args.matchmaking_s + 90.0) for p in self.peers]
        match_s = max(at for at, _ in matched) - t0
        return self._go("hivemind", plans, timeout, match_s)

    def _go(self, method: str, plans: Plans, timeout: float, match_s: float) -> dict[str, Any]:
        self.round += 1
        if method == "hivemind":
            msg: dict[str, Any] = {"op": "hm_go", "timeout": timeout}
        elif method == "tree":
            msg = {"op": "tree", "schedule": plans.schedule, "round": self.round}
        else:
            msg = {"op": "ring", "order": plans.ring, "round": self.round}
        sessions = {p.proc.pid for p in self.peers}
        busy0, total0 = cpu_busy()
        mine0 = session_cpu(sessions)
        t0 = time.perf_counter()
        for p in self.peers:
            p.send(**msg)
        line_cost = time.perf_counter() - t0
        replies = [p.recv(timeout + 30) for p in self.peers]
        wall = max(at for at, _ in replies) - t0
        busy1, total1 = cpu_busy()
        mine = session_cpu(sessions) - mine0
        warnings = {i: w[:6] for i, p in enumerate(self.peers) if (w := p.new_warnings())}
        return {
            "warnings": warnings,
            "s": wall,
            "peer_s": [r["s"] for _, r in replies],
            "err": max(r["err"] for _, r in replies),
            "cpu": (busy1 - busy0) / max(total1 - total0, 1e-9),
            "peer_cores": mine / wall,
            "match_s": match_s,
            "send_s": line_cost,
        }
