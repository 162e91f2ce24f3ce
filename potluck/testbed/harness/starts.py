"""Starting the tiny job from scratch, as a volunteer swarm would: a coordinator and two peers whose
announced addresses include one nobody listens on. Shared by tests/integration/swarm/test_dial_retries.py
(a few starts) and scripts/bench_starts.py (many)."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from potluck.testbed.localswarm import LocalSwarm

ROOT = Path(__file__).resolve().parents[3]  # the checkout: potluck/testbed/harness/ -> repo root
TINY_JOB = ROOT / "examples" / "tiny.toml"
PEER_ARGS = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu")


@dataclass(frozen=True)
class StartResult:
    ok: bool  # the job reached its last step and the coordinator exited 0
    plans: int  # plans published (1: the first plan held; more: re-plans after a failure)
    seconds: float  # from starting the coordinator to the job's end
    dial_errors: int  # "cannot open a stream" lines in the peers' logs
    tail: str  # the coordinator's last log lines, for a failure message


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1 that were free a moment ago (closed again: dead ports)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tiny_job_file(path: Path, steps: int, checkpoints: Path) -> Path:
    """examples/tiny.toml, cut to ``steps`` steps, writing its checkpoints under ``checkpoints``."""
    text = TINY_JOB.read_text()
    text = re.sub(r"(?m)^steps = \d+", f"steps = {steps}", text)
    text = re.sub(r'(?m)^dir = ".*"', f'dir = "{checkpoints}"', text)
    path.write_text(text)
    return path


def start_tiny_job(root: Path, swarm_id: str, steps: int = 1, timeout_s: float = 240.0) -> StartResult:
    """One start: coordinator + peers a, b, each announcing a dead 127.0.0.1 port before its real one;
    the job runs ``steps`` steps and ``potluck launch`` exits by itself. Every process is reaped."""
    root.mkdir(parents=True, exist_ok=True)
    job = tiny_job_file(root / "job.toml", steps, root / "ckpt")
    t = time.monotonic()
    with LocalSwarm(root, job, swarm_id=swarm_id, peer_args=PEER_ARGS, coordinator_args=("--json",)) as swarm:
        swarm.start_coordinator()
        for name in ("a", "b"):
            real, dead = free_ports(2)
            swarm.start_peer(
                name,
                "--host-maddrs",
                f"/ip4/127.0.0.1/tcp/{real}",
                "--announce-maddrs",
                f"/ip4/127.0.0.1/tcp/{dead}",  # announced first, and nothing listens there
                "--announce-maddrs",
                f"/ip4/127.0.0.1/tcp/{real}",
            )
        coordinator = swarm.procs["coordinator"]
        with contextlib.suppress(subprocess.TimeoutExpired):  # a start that hangs is a failed start
            coordinator.popen.wait(timeout=timeout_s)
        seconds = time.monotonic() - t
        log = coordinator.log.read_text(errors="replace")
        summaries = [json.loads(line) for line in log.splitlines() if line.startswith('{"steps"')]
        ok = coordinator.popen.returncode == 0 and bool(summaries) and summaries[-1]["steps"] == steps
        dial_errors = sum(
            swarm.procs[n].log.read_text(errors="replace").count("cannot open a stream") for n in ("a", "b")
        )
        return StartResult(
            ok, len(re.findall(r"plan epoch \d+:", log)), seconds, dial_errors, coordinator.tail(30)
        )
