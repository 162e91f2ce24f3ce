"""A swarm of local processes on loopback: one coordinator and N peers, each a real ``potluck`` process
with its own p2pd. Used by ``potluck demo`` and by the integration tests.

Each process starts in its own session, so its process group holds it and its p2pd child; stopping
signals that group by the PID we recorded, never by name, and always reaps what it started. When the
process that owns the swarm dies without stopping it (SIGKILL, the OOM killer), every child gets SIGKILL
from the kernel (``potluck.lifeline``), and each child's p2pd dies with that child (``potluck.net.node``).
Spawn from a long-lived thread: the kernel ties the signal to the thread that forked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from potluck import lifeline
from potluck.net.client import read_live_peers
from potluck.net.config import NetworkConfig
from potluck.protocol.invite import Invite, read_invite
from potluck.protocol.membership import PeerView

logger = logging.getLogger(__name__)

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
# Where a process runs: a command prefix (e.g. ``ip netns exec NS``) and the multiaddr it listens on.
Placement = Callable[[str], tuple[tuple[str, ...], str]]


def on_loopback(name: str) -> tuple[tuple[str, ...], str]:
    """Every process on this machine's loopback (the default)."""
    return (), LOOPBACK


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal_group(self, sig: int) -> None:
        """Signal the process group we created for this process (it and its p2pd)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class LocalSwarm:
    root: Path  # run directory: keys, logs, invite
    job_file: Path
    swarm_id: str = "local"
    peer_args: tuple[str, ...] = ()
    coordinator_args: tuple[str, ...] = ()
    verbose: int = 0  # -v flags given to every child (their logs go to <root>/<name>.log)
    # Per process name: where it runs (a network namespace of a testbed, say); loopback by default.
    placement: Placement = on_loopback
    procs: dict[str, Proc] = field(default_factory=dict)
    invite: Invite | None = None

    def _spawn(self, name: str, args: list[str], env: Mapping[str, str] | None = None) -> Proc:
        """``env``: entries added to this process's environment (an injected fault, ``faults.as_env``)."""
        self.root.mkdir(parents=True, exist_ok=True)
        log = self.root / f"{name}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        prefix, _ = self.placement(name)
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                [*prefix, sys.executable, "-m", "potluck", *(["-v"] * self.verbose), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                # SIGKILL, not SIGTERM: with its parent gone nobody would wait for a graceful leave, and a
                # child stuck in a step must not outlive it; its p2pd follows it the same way.
                preexec_fn=lifeline.preexec(signal.SIGKILL),
            )
        lifeline.after_spawn(popen.pid, signal.SIGKILL, group=True)
        proc = Proc(name, popen, log)
        self.procs[name] = proc
        logger.info("started %s (pid %d)", name, popen.pid)
        return proc

    def start_coordinator(self, timeout_s: float = 60.0, restart: bool = False) -> Invite:
        """Start ``potluck launch`` and wait for its invite. ``restart``: start it again after it died,
        with the same key and swarm id (it rejoins through the peers it remembers); the previous process
        stays listed as ``coordinator-<n>`` with its log in ``coordinator-<n>.log``."""
        if restart:
            self._retire("coordinator")
        invite_file = self.root / "invite.txt"
        invite_file.unlink(missing_ok=True)
        proc = self._spawn(
            "coordinator",
            [
                "launch",
                str(self.job_file),
                "--invite-file",
                str(invite_file),
                "--swarm-id",
                self.swarm_id,
                "--identity",
                str(self.root / "coordinator.pem"),
                "--host-maddrs",
                self.placement("coordinator")[1],
                "--poll-interval",
                "1",
                *self.coordinator_args,
            ],
        )
        deadline = time.monotonic() + timeout_s
        while not invite_file.exists() or not invite_file.read_text().strip():
            if not proc.alive():
                raise RuntimeError(f"coordinator exited with {proc.popen.returncode}:\n{proc.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"coordinator wrote no invite within {timeout_s:.0f} s:\n{proc.tail()}")
            time.sleep(0.1)
        self.invite = read_invite(f"@{invite_file}")
        return self.invite

    def _retire(self, name: str) -> None:
        """Keep a dead process under a new name (reaped on close), so ``name`` can be started again."""
        old = self.procs.pop(name)
        if old.alive():
            self.procs[name] = old
            raise RuntimeError(f"{name} (pid {old.pid}) is still running; stop it before a restart")
        n = sum(1 for key in self.procs if key.startswith(f"{name}-")) + 1
        log = old.log.with_name(f"{name}-{n}.log")
        old.log.rename(log)
        self.procs[f"{name}-{n}"] = Proc(f"{name}-{n}", old.popen, log)

    def start_job(self, name: str, job_file: Path, *extra: str) -> Proc:
        """``potluck launch JOB_FILE --join`` as process ``name``: another job on this swarm, its owner's
        key in ``<root>/<name>.pem`` (docs/multijob.md)."""
        assert self.invite is not None, "start the coordinator first"
        return self._spawn(
            name,
            [
                "launch",
                str(job_file),
                "--join",
                self.invite.encode(),
                "--identity",
                str(self.root / f"{name}.pem"),
                "--host-maddrs",
                self.placement(name)[1],
                "--poll-interval",
                "1",
                *extra,
            ],
        )

    def start_peer(self, name: str, *extra: str, env: Mapping[str, str] | None = None) -> Proc:
        """``potluck peer`` as process ``name``; ``env`` adds to its environment (``faults.as_env``)."""
        assert self.invite is not None, "start the coordinator first"
        return self._spawn(
            name,
            [
                "peer",
                "--join",
                self.invite.encode(),
                "--state-dir",  # its key and checkpoints: as on a machine of its own
                str(self.root / name),
                "--host-maddrs",
                self.placement(name)[1],
                *self.peer_args,
                *extra,
            ],
            env,
        )

    def live_peers(self, timeout_s: float = 15.0) -> list[PeerView]:
        assert self.invite is not None
        net = NetworkConfig(host_maddrs=(LOOPBACK,), bootstrap_timeout_s=timeout_s)
        return asyncio.run(read_live_peers(self.invite, net, timeout_s))

    def wait_for(
        self, predicate: Callable[[list[PeerView]], bool], timeout_s: float, poll_s: float = 1.0
    ) -> list[PeerView]:
        """Poll the swarm until ``predicate(peers)`` holds; return the peers seen last."""
        deadline = time.monotonic() + timeout_s
        peers: list[PeerView] = []
        while True:
            try:
                peers = self.live_peers()
            except Exception as e:  # the swarm may still be starting: expected, so info, with the traceback
                logger.info("status read failed: %s", e, exc_info=True)
            if predicate(peers):
                return peers
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"swarm did not reach the expected state in {timeout_s:.0f} s; saw {len(peers)}"
                )
            time.sleep(poll_s)

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> float:
        """Signal one process (SIGKILL: its whole group, like a crash); return seconds until it exited."""
        proc = self.procs[name]
        start = time.monotonic()
        if sig == signal.SIGKILL:
            proc.signal_group(signal.SIGKILL)
        else:
            proc.popen.send_signal(sig)
        try:
            proc.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.signal_group(signal.SIGKILL)
            proc.popen.wait(timeout=5)
        elapsed = time.monotonic() - start
        proc.signal_group(signal.SIGKILL)  # its p2pd, if it outlived it
        return elapsed

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop peers, then the coordinator: SIGTERM, bounded wait, SIGKILL the group; reap everything."""
        order = [n for n in self.procs if n != "coordinator"] + [n for n in self.procs if n == "coordinator"]
        for name in order:
            if self.procs[name].alive():
                self.procs[name].popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for name in order:
            proc = self.procs[name]
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s did not exit in time; killing its process group", name)
            proc.signal_group(signal.SIGKILL)
            proc.popen.wait(timeout=5)

    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
