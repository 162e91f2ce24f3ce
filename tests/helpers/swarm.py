"""Shared helpers for integration tests: a local swarm of real processes, the CLI as a subprocess,
and fault injection through a raw hivemind node that bypasses potluck's validation."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hivemind.dht.node import DHTNode
from hivemind.utils import get_dht_time

from potluck.protocol.invite import Invite
from potluck.protocol.keys import dht_key
from potluck.testbed.localswarm import LOOPBACK, LocalSwarm
from tests.helpers.logs import launch_finished

ROOT = Path(__file__).resolve().parents[2]
TINY_JOB = ROOT / "examples" / "tiny.toml"


@contextmanager
def local_swarm(tmp: Path, n_peers: int, ttl: float = 30.0, swarm_id: str = "itest") -> Iterator[LocalSwarm]:
    """A coordinator and ``n_peers`` peers (named peer0..), reaped on exit whatever happens."""
    swarm = LocalSwarm(
        tmp,
        TINY_JOB,
        swarm_id=swarm_id,
        peer_args=("--ttl", str(ttl), "--probe-seconds", "0.1"),
        coordinator_args=("--membership-only",),  # these tests are about membership, not training
    )
    try:
        swarm.start_coordinator()
        for i in range(n_peers):
            swarm.start_peer(f"peer{i}")
        yield swarm
    finally:
        swarm.close()


def multijob_swarm(tmp: Path, home_job: Path, swarm_id: str, lease_s: float, *peer_extra: str) -> LocalSwarm:
    """A swarm whose coordinator allocates its CPU peers across jobs (docs/multijob.md): ``lease_s``
    leases, peers classed by device only (their start-up probes differ on shared cores). Peers run one
    thread each with short heartbeats and step timeouts; ``peer_extra`` adds to their options."""
    peer_args = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu", "--ttl", "15")
    return LocalSwarm(
        tmp / "run",
        home_job,
        swarm_id=swarm_id,
        peer_args=(*peer_args, "--step-timeout", "10", *peer_extra),
        coordinator_args=("--lease-seconds", str(lease_s), "--alloc-classes", "device", "--json"),
        verbose=1,
    )


def potluck_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run the real console entry point in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "potluck", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def status_json(invite: Invite) -> dict[str, Any]:
    # The process itself may take a minute to start on a loaded machine (it imports torch).
    result = potluck_cli("status", "--join", invite.encode(), "--json", "--timeout", "20", timeout=120)
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


class RawNode:
    """A plain hivemind DHT node with NO validator, run in a background thread: an attacker's view.

    It stays up while the test reads the swarm, so lookups can reach its local copies of bad records.
    """

    def __init__(self, invite: Invite) -> None:
        self.invite = invite
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.node: DHTNode = self._call(
            DHTNode.create(
                initial_peers=list(invite.bootstrap),
                host_maddrs=[LOOPBACK],
                nat_port_map=False,
                auto_nat=False,
            )
        )

    def _call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def store(self, name: str, subkey: Any, value: bytes, ttl: float = 60.0) -> bool:
        key = dht_key(self.invite.swarm_id, name)
        return bool(self._call(self.node.store(key, value, get_dht_time() + ttl, subkey=subkey)))

    def fetch(self, name: str) -> dict[Any, bytes]:
        """Every value stored under ``name`` (by subkey), unverified: what an attacker can read."""
        found = self._call(self.node.get(dht_key(self.invite.swarm_id, name), latest=True))
        if found is None or not isinstance(found.value, dict):
            return {}
        return {sk: item.value for sk, item in found.value.items()}

    def close(self) -> None:
        try:
            self._call(self.node.shutdown())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()


@dataclass(frozen=True)
class ProcInfo:
    """One process as /proc shows it; ``start`` (clock ticks after boot) tells a reused PID apart."""

    pid: int
    ppid: int
    comm: str
    state: str
    start: int


def proc_info(pid: int) -> ProcInfo | None:
    """The process ``pid`` from /proc/<pid>/stat, or None once it is gone (Linux only)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm is in parentheses and may itself hold spaces or parentheses: split at the last ")".
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return ProcInfo(pid, int(fields[1]), comm, fields[0], int(fields[19]))


def descendants(root: int) -> list[ProcInfo]:
    """Every live process below ``root`` (children, their children, ...), found by PPID in /proc."""
    procs = [p for p in (proc_info(int(d)) for d in os.listdir("/proc") if d.isdigit()) if p is not None]
    children: dict[int, list[ProcInfo]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p)
    out: list[ProcInfo] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child.pid)
    return out


def still_running(p: ProcInfo) -> bool:
    """True while the very process ``p`` exists and is not a zombie (a zombie has already died)."""
    now = proc_info(p.pid)
    return now is not None and now.start == p.start and now.state not in ("Z", "X")


def kill_recorded(procs: list[ProcInfo]) -> None:
    """SIGKILL each recorded process that is still the same process (by PID and start time)."""
    for p in procs:
        if still_running(p):
            with suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)


CHURN_PEERS = ("a", "b", "c", "d")


def start_on_own_disks(swarm: LocalSwarm, names: tuple[str, ...] = CHURN_PEERS) -> None:
    """The coordinator, then one peer per name, each keeping its checkpoints on its own "disk" (no
    peer can read another's): the churn and leave swarms."""
    swarm.start_coordinator()
    for name in names:
        swarm.start_peer(name, "--checkpoint-dir", str(swarm.root / name / "ckpt"))


def placed_at(swarm: LocalSwarm, stage: int, replica: int, names: tuple[str, ...] = CHURN_PEERS) -> str:
    """The name of the peer that plan epoch 1 (the coordinator's table) placed at (stage, replica)."""
    from potluck.protocol.identity import Identity

    text = swarm.procs["coordinator"].log.read_text(errors="replace")
    row = re.search(rf"│ {stage} +│ [0-9-]+ +│ ([\w, ]+?) +│", text[text.index("plan epoch 1") :])
    assert row is not None, text[-3000:]
    short = re.findall(r"\w{12}", row.group(1))[replica]
    ids = {n: Identity.load(swarm.root / n / "identity.pem").peer_id for n in names}
    return next(n for n, pid in ids.items() if pid.startswith(short))


def committed_step(swarm: LocalSwarm) -> int:
    """The newest step the coordinator's log shows committed."""
    text = swarm.procs["coordinator"].log.read_text(errors="replace")
    return max(int(s) for s in re.findall(r"step (\d+)/", text))


def churn_swarm(tmp_path: Path, job: Path, swarm_id: str, step_timeout_s: float = 5, **kw: Any) -> LocalSwarm:
    """A LocalSwarm of CPU peers with a 15 s heartbeat TTL, under ``tmp_path/run``, whose coordinator
    logs JSON as well (the summary ``assert_no_step_lost`` reads)."""
    peer_args = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu", "--ttl", "15")
    peer_args += ("--step-timeout", f"{step_timeout_s:g}")
    return LocalSwarm(
        tmp_path / "run", job, swarm_id=swarm_id, peer_args=peer_args, coordinator_args=("--json",), **kw
    )


def assert_goes_on_to_the_end(
    swarm: LocalSwarm, steps: int, before: int, event: str, epoch2: str, wait_s: float, end_s: float
) -> str:
    """After ``event`` (the swarm had committed ``before``): epoch 2 (``epoch2``, a pattern whose group
    is its start step) starts at or after it within ``wait_s``, and the launch ends by itself at the
    job's last step within ``end_s``, no committed step lost. Returns the coordinator's log."""
    from tests.helpers.logs import assert_no_step_lost, wait_for

    log = swarm.procs["coordinator"].log
    start = int(wait_for(log, epoch2, wait_s).group(1))
    assert start >= before, f"epoch 2 starts at step {start}; the swarm had committed {before}"
    coordinator = swarm.procs["coordinator"]
    coordinator.popen.wait(timeout=end_s)
    text = log.read_text(errors="replace")
    assert coordinator.popen.returncode == 0, text[-3000:]
    assert_no_step_lost(text, steps, before, event)
    return text


def write_job(path: Path, top: dict[str, Any], **sections: dict[str, Any]) -> Path:
    """A job file: ``top``-level keys, then a ``[section]`` table per keyword (scalars only)."""

    def line(key: str, value: Any) -> str:
        return f"{key} = {json.dumps(value)}"  # JSON strings, numbers and booleans are TOML too

    lines = [line(k, v) for k, v in top.items()]
    for name, table in sections.items():
        lines += [f"[{name}]", *(line(k, v) for k, v in table.items())]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@contextmanager
def run_to_the_end(
    tmp_path: Path, job: Path, swarm_id: str, steps: int, peers: tuple[str, ...] = ("a", "b")
) -> Iterator[tuple[LocalSwarm, str]]:
    """``potluck launch`` of ``job`` (from its owner's directory) and CPU peers, each on a disk of its
    own, run to the job's last step: yields the swarm (its logs at INFO) and the coordinator's log."""
    peer_args = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu")
    with LocalSwarm(
        tmp_path / "run", job, swarm_id=swarm_id, peer_args=peer_args, coordinator_args=("--json",), verbose=1
    ) as swarm:
        start_on_own_disks(swarm, peers)
        coordinator = swarm.procs["coordinator"]
        yield swarm, launch_finished(coordinator.popen, coordinator.log, steps, timeout_s=240)
