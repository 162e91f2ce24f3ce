"""Shaped virtual networks for benchmarks: one network namespace per peer, a bridge, tc rate limits.

Layout (every name carries this process's pid, so parallel or leftover runs never collide)::

    ns "plhv<pid>-br":  bridge br0 with ports p0 .. p{n-1}      (no address: it only switches frames)
    ns "plhv<pid>-<i>": eth0 = 10.77.0.<i+1>/24, veth peer of p<i>; lo up

Both veth ends are created directly inside their namespaces, so nothing is added to the root
namespace and no route leads out: traffic between peers stays inside the namespaces this module made.

Shaping (egress only; the kernel here has tbf/htb but no netem, so no delay or loss):

- upload cap of peer i: a tbf (or, with per-destination rates, an htb tree) on eth0 in ns i;
- download cap of peer i: a tbf on the bridge port p<i> (its egress is peer i's ingress).

``Netlab.close()`` deletes every namespace it created (which deletes their veths and qdiscs); it runs
from ``with`` exits, and callers should also call it from signal handlers. Root is required.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

SUBNET = "10.77.0"


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise SystemExit(
            f"{what} needs root: it creates network namespaces, veth pairs and tc qdiscs "
            "(run it with sudo, or as root in a VM/container with CAP_NET_ADMIN and CAP_SYS_ADMIN)"
        )


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _burst_bytes(mbit: float) -> int:
    """tbf/htb bucket: at least 32 KiB and about 4 ms at the rate (tbf needs > rate / HZ)."""
    return max(32 * 1024, int(mbit * 1e6 / 8 * 0.004))


class Netlab:
    """``n`` peer namespaces on one bridge; shape them with ``shape``; ``close`` removes everything."""

    def __init__(self, n: int, tag: str | None = None, queue_ms: float = 100.0) -> None:
        if not 2 <= n <= 200:
            raise ValueError("Netlab supports 2..200 peers")
        self.n = n
        self.queue_ms = queue_ms  # tbf queue: packets wait at most this long at the rate, then drop
        self.tag = tag or f"plhv{os.getpid()}"
        self.bridge_ns = f"{self.tag}-br"
        self.peer_ns = [f"{self.tag}-{i}" for i in range(n)]
        self.addrs = [f"{SUBNET}.{i + 1}" for i in range(n)]
        self._created: list[str] = []
        self._closed = False

    # ---- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> Netlab:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self) -> None:
        try:
            self._add_ns(self.bridge_ns)
            br = self.bridge_ns
            _run("ip", "-n", br, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", br, "link", "set", "br0", "up")
            _run("ip", "-n", br, "link", "set", "lo", "up")
            for i, ns in enumerate(self.peer_ns):
                self._add_ns(ns)
                _run(
                    "ip",
                    "link",
                    "add",
                    "eth0",
                    "netns",
                    ns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    f"p{i}",
                    "netns",
                    br,
                )
                _run("ip", "-n", br, "link", "set", f"p{i}", "master", "br0")
                _run("ip", "-n", br, "link", "set", f"p{i}", "up")
                _run("ip", "-n", ns, "addr", "add", f"{self.addrs[i]}/24", "dev", "eth0")
                _run("ip", "-n", ns, "link", "set", "eth0", "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def _add_ns(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._created.append(name)

    def close(self) -> None:
        """Delete every namespace this object created (idempotent; never raises)."""
        if self._closed:
            return
        for name in reversed(self._created):
            _run("ip", "netns", "del", name, check=False)
        self._created.clear()
        self._closed = True

    def leftovers(self) -> list[str]:
        """Namespaces with this lab's tag that still exist (empty after ``close``)."""
        out = _run("ip", "netns", "list", check=False).stdout
        return [line.split()[0] for line in out.splitlines() if line.startswith(self.tag + "-")]

    # ---- shaping -----------------------------------------------------------------------------------

    def exec_prefix(self, i: int) -> list[str]:
        """Command prefix that runs a program inside peer i's namespace."""
        return ["ip", "netns", "exec", self.peer_ns[i]]

    def shape(
        self,
        up_mbit: Sequence[float | None],
        down_mbit: Sequence[float | None] | None = None,
        pair_mbit: Mapping[tuple[int, int], float] | None = None,
    ) -> None:
        """Replace every peer's qdiscs: upload caps, optional download caps, optional per-pair caps.

        ``pair_mbit[(i, j)]`` caps traffic i -> j below i's upload cap (htb class per destination, the
        rest of i's traffic in a default class; all share i's upload cap). ``None`` = unshaped. Every
        queue holds at most ``queue_ms`` of data at its rate (tbf latency, bfifo under htb classes).
        """
        pair_mbit = pair_mbit or {}
        for i, ns in enumerate(self.peer_ns):
            tc = ["tc", "-n", ns]
            _run(*tc, "qdisc", "del", "dev", "eth0", "root", check=False)
            up = up_mbit[i]
            mine = {j: r for (s, j), r in pair_mbit.items() if s == i}
            if not mine:
                if up is not None:
                    _run(*tc, "qdisc", "add", "dev", "eth0", "root", *self._tbf(up))
                continue
            total = up if up is not None else 10_000.0
            _run(*tc, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10")
            # Children's guaranteed rates sum to at most the parent's, so the parent caps the total.
            guaranteed = total / (len(mine) + 1)
            self._htb_class(tc, "1:1", "1:", total, total)
            self._htb_class(tc, "1:10", "1:1", total, guaranteed)
            for k, (j, rate) in enumerate(sorted(mine.items())):
                classid = f"1:{100 + k}"
                self._htb_class(tc, classid, "1:1", min(rate, total), min(rate, guaranteed))
                match = ["u32", "match", "ip", "dst", f"{self.addrs[j]}/32", "flowid", classid]
                _run(
                    *tc, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", *match
                )
        for i in range(self.n):
            tc = ["tc", "-n", self.bridge_ns]
            _run(*tc, "qdisc", "del", "dev", f"p{i}", "root", check=False)
            down = None if down_mbit is None else down_mbit[i]
            if down is not None:
                _run(*tc, "qdisc", "add", "dev", f"p{i}", "root", *self._tbf(down))

    def _tbf(self, mbit: float) -> list[str]:
        burst = str(_burst_bytes(mbit))
        return ["tbf", "rate", f"{mbit}mbit", "burst", burst, "latency", f"{self.queue_ms:g}ms"]

    def _htb_class(self, tc: list[str], classid: str, parent: str, ceil: float, rate: float) -> None:
        b = str(_burst_bytes(ceil))
        spec = ["rate", f"{rate}mbit", "ceil", f"{ceil}mbit", "burst", b, "cburst", b, "quantum", "60000"]
        _run(*tc, "class", "add", "dev", "eth0", "parent", parent, "classid", classid, "htb", *spec)
        if classid != "1:1":  # leaf: a byte fifo of queue_ms at the class's ceiling (and at least two
            # 64 KiB GSO super-packets, which htb, unlike tbf, does not split: a smaller fifo drops them)
            limit = str(max(128 * 1024, int(ceil * 1e6 / 8 * self.queue_ms / 1000)))
            _run(*tc, "qdisc", "add", "dev", "eth0", "parent", classid, "bfifo", "limit", limit)

    def qdisc_stats(self) -> str:
        """``tc -s qdisc`` of every shaped device (for debugging a run)."""
        out = []
        for ns in self.peer_ns:
            out.append(f"# {ns} eth0\n" + _run("tc", "-n", ns, "-s", "qdisc", "show", "dev", "eth0").stdout)
        return "\n".join(out)
