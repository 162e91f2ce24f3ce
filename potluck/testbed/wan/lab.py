"""``WanLab``: one network namespace per peer, joined by the userspace relay's emulated links.

Layout (every name carries the creating process's pid, so parallel or leftover runs never collide)::

    ns "plw<pid>-<i>": tun0 = 10.79.0.<i+1>/24 (the subnet routes into it), lo up
    ... behind a NAT:  tun0 = 192.168.1.2/24, route 10.79.0.0/24 via tun0; 10.79.0.<i+1> is its router's
    relay process:      holds every tun0's fd; forwards with the scenario's delays and rates, and plays
                        each NATed peer's home router (``potluck.testbed.wan.nat``)

Nothing is added to the root namespace: the relay creates each ``tun0`` from inside its namespace, and
no route leads out of the subnet, so emulated traffic stays between the namespaces this object made.

``close()`` (also on ``with`` exit) ends every child it started by PID (SIGTERM, then SIGKILL), then
the relay (its TUN devices vanish with its fds), then deletes its namespaces; SIGINT and SIGTERM are
held off until it is done. Children get ``lifeline.preexec()``, so they die if this process is killed
outright; only its empty namespaces can then remain: ``stale_namespaces()`` finds them. Root only.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import IO, Any

from potluck.lifeline import after_spawn, preexec
from potluck.testbed.errors import TestbedError
from potluck.testbed.wan.nat import PRIVATE_ADDR
from potluck.testbed.wan.spec import INF, WanSpec

logger = logging.getLogger(__name__)

SUBNET = "10.79.0"
DEV = "tun0"
TAG_PREFIX = "plw"
READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 3.0
RELAY_ARGV = ["-c", "from potluck.testbed.wan.relay import main; main()"]  # not -m: see check.AGENT_ARGV


def require_support() -> None:
    """Raise ``TestbedError`` saying what is missing: root, /dev/net/tun, the ``ip`` tool."""
    if os.geteuid() != 0:
        raise TestbedError(
            "the WAN testbed needs root: it creates network namespaces and TUN devices "
            "(run it with sudo, or as root in a VM/container with CAP_NET_ADMIN and CAP_SYS_ADMIN)"
        )
    if not os.path.exists("/dev/net/tun"):
        raise TestbedError("/dev/net/tun is missing: the WAN testbed needs the kernel's TUN driver")
    if _run("ip", "-V", check=False).returncode != 0:
        raise TestbedError("the `ip` tool (iproute2) is not installed")


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(args, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise TestbedError(f"{args[0]} is not installed") from exc
    if check and proc.returncode != 0:
        raise TestbedError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_namespaces() -> list[str]:
    """Namespaces of WAN labs whose creating process is gone (left by a ``kill -9``)."""
    out = _run("ip", "netns", "list", check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    pattern = re.compile(rf"^{TAG_PREFIX}(\d+)-\d+$")
    return [n for n in names if (m := pattern.match(n)) and not _alive(int(m.group(1)))]


def delete_namespace(name: str) -> None:
    _run("ip", "netns", "del", name)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise ``SystemExit`` in the main thread, so ``with`` blocks
    (and ``WanLab.close``) run as they do for Ctrl+C's ``KeyboardInterrupt``."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class WanLab:
    """The emulated WAN of ``spec``: build with ``create`` (or ``with``), remove with ``close``."""

    def __init__(
        self, spec: WanSpec, tag: str | None = None, queue_ms: float = 100.0, mtu: int = 1500
    ) -> None:
        if spec.n > 250:
            raise TestbedError("the WAN testbed supports at most 250 peers")
        self.spec = spec
        self.queue_ms = queue_ms
        self.mtu = mtu
        self.tag = tag or f"{TAG_PREFIX}{os.getpid()}"
        self.namespaces = [f"{self.tag}-{i}" for i in range(spec.n)]
        self._created: list[str] = []
        self._children: list[subprocess.Popen[Any]] = []
        self._relay: subprocess.Popen[bytes] | None = None
        self._relay_log: IO[bytes] | None = None
        self._closed = False

    # ---- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> WanLab:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self) -> None:
        require_support()
        try:
            for ns in self.namespaces:
                _run("ip", "netns", "add", ns)
                self._created.append(ns)
                _run("ip", "-n", ns, "link", "set", "lo", "up")
            self._start_relay()
            for i, ns in enumerate(self.namespaces):
                _run("ip", "-n", ns, "addr", "add", f"{self.local_addr(i)}/24", "dev", DEV)
                _run("ip", "-n", ns, "link", "set", DEV, "mtu", str(self.mtu), "up")
                if self.spec.nat_of(i):
                    _run("ip", "-n", ns, "route", "add", f"{SUBNET}.0/24", "dev", DEV)
        except BaseException:
            self.close()
            raise
        logger.info("WAN lab %s: %d namespaces, relay pid %d", self.tag, self.spec.n, self.relay_pid)

    def relay_config(self) -> dict[str, Any]:
        def j(x: float) -> float | None:
            return None if x == INF else x

        s = self.spec
        return {
            "namespaces": self.namespaces,
            "dev": DEV,
            "subnet": SUBNET,
            "mtu": self.mtu,
            "queue_ms": self.queue_ms,
            "latency_ms": [list(row) for row in s.latency_ms],
            "pair_mbps": [[j(x) for x in row] for row in s.pair_mbps],
            "up_mbps": [j(x) for x in s.up_mbps],
            "down_mbps": [j(x) for x in s.down_mbps],
            "nat": [s.nat_of(i) or None for i in range(s.n)],
        }

    def _start_relay(self) -> None:
        self._relay_log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        relay = subprocess.Popen(
            [sys.executable, *RELAY_ARGV],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._relay_log,
            preexec_fn=preexec(),
            start_new_session=True,  # a terminal's Ctrl+C reaches us, and we stop the relay in order
        )
        self._relay = relay
        after_spawn(relay.pid)
        assert relay.stdin is not None and relay.stdout is not None
        relay.stdin.write(json.dumps(self.relay_config()).encode())
        relay.stdin.close()
        ready, _, _ = select.select([relay.stdout], [], [], READY_TIMEOUT_S)
        line = relay.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            raise TestbedError(f"the relay did not start: {self._relay_stderr() or 'no output'}")

    def _relay_stderr(self) -> str:
        if self._relay_log is None:
            return ""
        self._relay_log.seek(0)
        return self._relay_log.read().decode(errors="replace").strip()[-2000:]

    def close(self) -> None:
        """End every child and the relay by PID, delete this lab's namespaces (idempotent, no raise)."""
        if self._closed:
            return
        held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)  # a second Ctrl+C must not cut teardown short
        try:
            for proc in reversed(self._children):
                _stop(proc)
            self._children.clear()
            if self._relay is not None:
                _stop(self._relay)
                logger.debug("relay log: %s", self._relay_stderr())
            if self._relay_log is not None:
                self._relay_log.close()
            for ns in reversed(self._created):
                _run("ip", "netns", "del", ns, check=False)
            self._created.clear()
            self._closed = True
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def leftovers(self) -> list[str]:
        """This lab's namespaces that still exist (empty after ``close``)."""
        out = _run("ip", "netns", "list", check=False).stdout
        return [line.split()[0] for line in out.splitlines() if line.startswith(self.tag + "-")]

    # ---- using it ----------------------------------------------------------------------------------

    def addr(self, i: int) -> str:
        """Peer i's public address: where others send to it (its home router's, when it is NATed)."""
        return f"{SUBNET}.{i + 1}"

    def local_addr(self, i: int) -> str:
        """The address of peer i's own interface, to listen on (a private one behind a NAT)."""
        return PRIVATE_ADDR if self.spec.nat_of(i) else self.addr(i)

    def natted(self) -> list[int]:
        return [i for i in range(self.spec.n) if self.spec.nat_of(i)]

    def exec_prefix(self, i: int) -> list[str]:
        """Command prefix that runs a program inside peer i's namespace."""
        return ["ip", "netns", "exec", self.namespaces[i]]

    def spawn(self, i: int, argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in peer i's namespace; ``close`` ends it by PID, and it dies with us."""
        if self._closed or self._relay is None:
            raise TestbedError("the WAN lab is not running")
        popen.setdefault("start_new_session", True)
        proc = subprocess.Popen([*self.exec_prefix(i), *argv], preexec_fn=preexec(), **popen)
        after_spawn(proc.pid)
        self._children.append(proc)
        return proc

    @property
    def relay_pid(self) -> int:
        return self._relay.pid if self._relay is not None else -1

    def relay_cpu_s(self) -> float:
        """CPU seconds (user + system) the relay has used so far; 0 when it is not running."""
        try:
            with open(f"/proc/{self.relay_pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        try:
            proc.terminate()
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with suppress(OSError):
                stream.close()
