"""``potluck peer --share-device``: a second peer process on the same device, for a second job.

Gavel's space sharing runs two jobs on one accelerator at once. A peer serves one job at a time (its
worker, its state server and its protocol handlers are the job's), so a device that may be shared runs
two peers: the volunteer's own and a **co-tenant** it starts as a child process. The two records name
each other (``PeerRecord.cotenant`` / ``cotenant_of``); the swarm's allocator counts the device once,
and leases a space-shared row to the pair: the device's own peer serves one job, the co-tenant the
other (``Lease.partners``). Without such a lease the co-tenant idles and the device is its own peer's.

The co-tenant runs the volunteer's own command line with its own state directory (its key, its
checkpoints) under ``STATE_DIR/cotenant``, reading the job data the volunteer keeps under
``STATE_DIR/data``. It dies with its parent (``lifeline``), leaves when its parent is asked to leave,
and is reaped by PID.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from potluck import lifeline

logger = logging.getLogger(__name__)

COTENANT_DIR = "cotenant"  # under the volunteer's state directory
# Options of the volunteer's command line the co-tenant must not inherit: its own key, its own ports
# and addresses, its own checkpoints (each replaced below), and the flag that would start a third peer.
_DROPPED = {"--identity", "--metrics-port", "--announce-maddrs", "--checkpoint-dir", "--host-maddrs"}
_DROPPED_FLAGS = {"--share-device", "--no-share-device"}
_FIXED_PORT = re.compile(r"/(tcp|udp)/\d+")


def cotenant_argv(
    argv: Sequence[str], state_dir: Path, host_id: str, checkpoint_dir: Path | None
) -> list[str]:
    """The co-tenant's ``potluck`` arguments from the volunteer's (``argv``: after the program name,
    global options, then ``peer`` and its options). Its listen addresses keep the volunteer's hosts on
    any free port (two peers cannot share one)."""
    at = list(argv).index("peer")
    head, rest = list(argv[:at]), list(argv[at + 1 :])
    out: list[str] = []
    hosts: list[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        name, eq, value = arg.partition("=")
        if arg in _DROPPED_FLAGS:
            i += 1
            continue
        if name in _DROPPED:
            if not eq:
                value = rest[i + 1] if i + 1 < len(rest) else ""
                i += 1
            if name == "--host-maddrs":
                hosts.append(_FIXED_PORT.sub(r"/\1/0", value))
            i += 1
            continue
        out.append(arg)
        i += 1
    root = state_dir / COTENANT_DIR
    out += ["--state-dir", str(root), "--cotenant-of", host_id]
    for host in hosts:
        out += ["--host-maddrs", host]
    if checkpoint_dir is not None:
        out += ["--checkpoint-dir", str(checkpoint_dir.with_name(f"{checkpoint_dir.name}-{COTENANT_DIR}"))]
    return [*head, "peer", *out]


def prepare(state_dir: Path) -> Path:
    """The co-tenant's state directory, its ``data`` pointing at the volunteer's (one copy of the job's
    data per machine). Returns the directory."""
    root = state_dir / COTENANT_DIR
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data"
    if not data.exists() and not data.is_symlink():
        data.symlink_to(Path("..") / "data", target_is_directory=True)
    return root


def spawn(args: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start the co-tenant (``python -m potluck ARGS``); it dies with this process. Call from the main
    thread (``lifeline``: the parent of a PDEATHSIG is the thread that forked)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "potluck", *args],
        preexec_fn=lifeline.preexec(),
    )
    lifeline.after_spawn(child.pid)
    logger.info("co-tenant peer started (pid %d) for a second job on this device", child.pid)
    return child


def signal_leave(child: subprocess.Popen[bytes] | None) -> None:
    """Ask the co-tenant to leave (SIGTERM: it hands its work over first; a second one: at once)."""
    if child is not None and child.poll() is None:
        os.kill(child.pid, signal.SIGTERM)


def reap(child: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    """Wait for the co-tenant to leave, at most ``timeout_s``; then kill it. Always reaps it."""
    if child is None:
        return
    signal_leave(child)
    try:
        child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        logger.warning("co-tenant (pid %d) did not leave in %.0f s; killing it", child.pid, timeout_s)
        child.kill()
        child.wait()
