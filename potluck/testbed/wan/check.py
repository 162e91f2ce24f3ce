"""Measure an emulated WAN's links against the scenario: RTT and rate of each directed pair.

A probe agent (``potluck.testbed.wan.probe``) runs in every namespace. First every agent pings every
other peer at once (TCP ping-pong of 32-byte messages, TCP_NODELAY; the median of ``pings`` round trips
after 3 warm-up ones). Then one bulk TCP flow per directed pair, several at a time in rounds where no
peer takes part in two flows (``rounds``): a flow's ACKs go back over its receiver's upload, and on an
asymmetric link that upload may be the slow one, so a flow sharing it would slow the other's ACKs
(and its rate); ``serial=True`` runs one flow at a time. A flow sends ``skip_s + measure_s`` worth of
data at the target rate, with the system's congestion control, and its rate is measured over the
window that starts ``skip_s`` in (slow start excluded), from the sender's ``tcpi_delivered``.

``mbps_measured`` is the rate the link carried: delivered segments times the MTU, because each
1448-byte segment crosses the emulated link as a 1500-byte packet (IP and TCP headers are serialised
too, as on a real line). ``goodput_mbps`` counts the payload alone, about 3.5% lower.
"""

from __future__ import annotations

import json
import logging
import select
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from potluck.testbed.errors import TestbedError
from potluck.testbed.wan.probe import PORT
from potluck.testbed.wan.spec import INF, LinkTarget, link_targets

if TYPE_CHECKING:
    from potluck.testbed.wan.lab import WanLab

logger = logging.getLogger(__name__)

# Not ``-m potluck.testbed.wan.probe``: the package imports that module itself, so runpy would warn that
# it was already imported (on the user's terminal, once per agent) before running it again as __main__.
AGENT_ARGV = ["-c", "from potluck.testbed.wan.probe import main; main()"]

UNLIMITED_BYTES = 25_000_000  # a flow on a link without a rate limit sends this much

Pair = tuple[int, int]


@dataclass(frozen=True)
class LinkResult:
    a: int
    b: int
    rtt_ms_target: float
    rtt_ms_measured: float
    mbps_target: float | None  # None: no rate limit on this direction
    mbps_measured: float
    goodput_mbps: float

    def ok(self, tolerance: float) -> bool:
        rate_ok = self.mbps_target is None or within(self.mbps_measured, self.mbps_target, tolerance)
        return rate_ok and within(self.rtt_ms_measured, self.rtt_ms_target, tolerance)


@dataclass
class CheckReport:
    scenario: str
    tolerance: float
    links: list[LinkResult]
    relay_cpu_s: float
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return all(link.ok(self.tolerance) for link in self.links)

    def to_json(self) -> dict[str, Any]:
        links = [{**asdict(link), "ok": link.ok(self.tolerance)} for link in self.links]
        return {
            "scenario": self.scenario,
            "ok": self.ok,
            "tolerance": self.tolerance,
            "links": links,
            "relay_cpu_s": round(self.relay_cpu_s, 2),
            "elapsed_s": round(self.elapsed_s, 2),
        }


def within(measured: float, target: float, tolerance: float) -> bool:
    if target == 0:
        return abs(measured) <= tolerance
    return abs(measured - target) <= tolerance * abs(target)


def flow_plan(target: LinkTarget, measure_s: float) -> tuple[int, float]:
    """Bytes to send and the slow start to skip (0.3 s + 6 RTTs), so ``measure_s`` remain at the rate."""
    skip_s = 0.3 + 6.0 * target.rtt_ms / 1000.0
    if target.mbps == INF:
        return UNLIMITED_BYTES, skip_s
    return int(target.mbps * 1e6 / 8 * (skip_s + measure_s)), skip_s


def rounds(n: int, serial: bool = False) -> list[list[Pair]]:
    """Every directed pair once, grouped so that no peer is in two flows of a group (greedy, about
    n(n-1) / floor(n/2) groups)."""
    left = [(a, (a + k) % n) for k in range(1, n) for a in range(n)]
    if serial:
        return [[pair] for pair in left]
    out = []
    while left:
        used: set[int] = set()
        group = []
        for a, b in left:
            if a not in used and b not in used:
                group.append((a, b))
                used.update((a, b))
        out.append(group)
        left = [pair for pair in left if pair not in group]
    return out


def link_result(target: LinkTarget, rtt_ms: float, flow: dict[str, Any], mtu: int) -> LinkResult:
    """A directed link's entry from its ping median and its bulk flow's report."""
    if flow["window_s"] > 0:
        segs_per_s = flow["window_segs"] / flow["window_s"]
        wire, good = segs_per_s * mtu * 8e-6, segs_per_s * flow["mss"] * 8e-6
    else:  # ended before the skip: the receiver's rate over the whole flow, slow start included
        logger.warning("flow %d->%d ended before its slow-start skip", target.a, target.b)
        recv = flow["receiver"]
        good = recv["bytes"] / max(recv["seconds"], 1e-9) * 8e-6
        wire = good * mtu / flow["mss"]
    return LinkResult(
        a=target.a,
        b=target.b,
        rtt_ms_target=round(target.rtt_ms, 3),
        rtt_ms_measured=round(rtt_ms, 3),
        mbps_target=None if target.mbps == INF else round(target.mbps, 3),
        mbps_measured=round(wire, 3),
        goodput_mbps=round(good, 3),
    )


class Agents:
    """One probe agent per namespace, spoken to over its stdin/stdout (JSON lines)."""

    def __init__(self, lab: WanLab, port: int = PORT) -> None:
        self.port = port
        self.procs = [
            lab.spawn(
                i,
                [sys.executable, *AGENT_ARGV, str(port)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
            for i in range(lab.spec.n)
        ]
        for i in range(len(self.procs)):
            self.reply(i, 15.0)

    def ask(self, i: int, cmd: dict[str, Any]) -> None:
        stdin = self.procs[i].stdin
        assert stdin is not None
        stdin.write(json.dumps({**cmd, "port": self.port}) + "\n")
        stdin.flush()

    def reply(self, i: int, timeout_s: float) -> dict[str, Any]:
        stdout = self.procs[i].stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], timeout_s)
        line = stdout.readline() if ready else ""
        if not line:
            raise TestbedError(f"probe agent {i} did not answer within {timeout_s:.0f} s")
        out: dict[str, Any] = json.loads(line)
        if "error" in out:
            raise TestbedError(f"probe agent {i}: {out['error']}")
        return out

    def close(self, abort: bool = False) -> None:
        """Close their stdin: they exit on EOF, 2 s in all. ``abort`` (Ctrl+C, an error): end them at once,
        since one mid-flow reads the EOF only when its flow ends (30 s and more with a long
        ``measure_s``). The lab's ``close`` ends any that linger, by PID."""
        for proc in self.procs:
            if proc.stdin is not None:
                proc.stdin.close()
            if abort:
                proc.terminate()
        deadline = time.monotonic() + 2.0
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.terminate()


def measure(
    lab: WanLab, tolerance: float = 0.1, pings: int = 20, measure_s: float = 1.0, serial: bool = False
) -> CheckReport:
    """RTT and rate of every directed link of ``lab`` (its agents start and stop here). A link into a
    NATed device cannot be dialled (its router drops unsolicited connections): it is left out, and a
    round trip between a NATed and a public device is timed from the NATed side."""
    start = time.monotonic()
    cpu0 = lab.relay_cpu_s()
    targets = {(t.a, t.b): t for t in link_targets(lab.spec) if not lab.spec.nat_of(t.b)}
    agents = Agents(lab)
    aborted = True
    try:
        rtt = _pings(lab, agents, pings, max(t.rtt_ms for t in targets.values()))
        flows: dict[Pair, dict[str, Any]] = {}
        for group in rounds(lab.spec.n, serial):
            plans = {pair: flow_plan(targets[pair], measure_s) for pair in group if pair in targets}
            for (a, b), (nbytes, skip_s) in plans.items():
                agents.ask(a, {"op": "bulk", "dst": lab.addr(b), "bytes": nbytes, "skip_s": skip_s})
            if not plans:
                continue
            longest = max(skip for _, skip in plans.values()) + measure_s
            for a, b in plans:
                flows[(a, b)] = agents.reply(a, 30.0 + 5 * longest)
        aborted = False
    finally:
        agents.close(abort=aborted)
    links = [link_result(t, rtt[pair], flows[pair], lab.mtu) for pair, t in sorted(targets.items())]
    elapsed = time.monotonic() - start
    return CheckReport(lab.spec.name, tolerance, links, lab.relay_cpu_s() - cpu0, elapsed)


def _pings(lab: WanLab, agents: Agents, pings: int, max_rtt_ms: float) -> dict[Pair, float]:
    """Median RTT of every directed pair, all measured at once (they load the links very little)."""
    n = lab.spec.n
    public = [j for j in range(n) if not lab.spec.nat_of(j)]
    for i in range(n):
        agents.ask(i, {"op": "ping", "dsts": [lab.addr(j) for j in public if j != i], "count": pings})
    rtt: dict[Pair, float] = {}
    for i in range(n):
        got = agents.reply(i, 30.0 + pings * max_rtt_ms / 100.0)["rtt_ms"]
        for j in public:
            if j != i:
                rtt[(i, j)] = statistics.median(got[lab.addr(j)])
                rtt.setdefault((j, i), rtt[(i, j)])  # the NATed end of a pair is not pinged
    return rtt
