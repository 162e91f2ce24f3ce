#!/usr/bin/env python3
"""potluck's tree all-reduce vs hivemind's DecentralizedAverager (butterfly) on the same shaped links.

Every peer is a process in its own network namespace (potluck/testbed/netem.py), joined to the others by a
veth pair and a bridge; tc tbf qdiscs cap each peer's upload (and optionally its download), htb
classes optionally cap single pairs. Each peer runs one hivemind DHT (one p2pd daemon, listening on the
namespace's address) and uses it for both systems:

- hivemind: ``DecentralizedAverager`` (fp32, no compression, group size N, ``bandwidth`` = the peer's
  known cap, so its butterfly load balancing knows what the tree planner knows). Matchmaking runs
  first (``require_trigger``); the all-reduce is timed from the trigger to the last peer's result;
- potluck tree: ``tree_allreduce`` over a ``Mailbox`` on the same daemon, with the plan
  ``choose_tree_plan`` on the known caps (packed trees or one-hop stars, by the time model);
- potluck ring: ``ring_allreduce`` over the same mailbox, on the heaviest ring of ``pack_rings``.

Topologies per group size N (default 4 and 8): unshaped (the CPU floor: 2 cores shared by every
process; shaped times well above it mean the links, not the CPU, set the pace), uniform upload caps,
random node-capacitated caps (lognormal, clipped, one or two fast peers; ``--seeds``), and two sites
(per-pair caps across the sites, which hivemind's per-peer ``bandwidth`` cannot express).

Times are wall clock at the driver, from the "go" sent to every peer to the last peer's reply (medians
of ``--reps``, interleaved hivemind/tree/ring). Every peer checks its result against the true mean (max
abs diff); a wrong result is reported and left out of the medians. The "model" columns are
potluck.coordinator.trees.plan.predict_allreduce_time on the shaped rates times the TCP/IP goodput
factor 1448/1514 (hivemind: its own butterfly shares, scored as stars). JSON with every run:
bench-out/bench_vs_hivemind.json.

Needs root (namespaces, veth, tc). Cleans up its namespaces and processes on exit, Ctrl-C or SIGTERM.

    sudo .venv/bin/python scripts/bench_vs_hivemind.py [--quick] [--mbytes 16] [--reps 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

MIB = 1 << 20
GOODPUT = 1448 / 1514  # TCP payload per 1500-byte-MTU Ethernet frame (timestamps on)
HM_PART_BYTES = 1 << 19  # hivemind's DEFAULT_PART_SIZE_BYTES
PROTOCOL = "potluck/bench/vs-hivemind/1"
METHODS = ("hivemind", "tree", "ring")
TOLERANCE = 1e-4  # max |result - true mean| accepted (fp32 sums of N unit normals: ~1e-6)


# ==== topologies =========================================================================================


@dataclass
class Topology:
    name: str
    up: list[float | None]  # Mbit/s per peer (None: unshaped)
    down: list[float | None] | None = None
    pair: dict[tuple[int, int], float] = field(default_factory=dict)  # Mbit/s caps on single pairs
    note: str = ""

    @property
    def shaped(self) -> bool:
        return any(u is not None for u in self.up) or bool(self.pair)


def make_topologies(n: int, args: argparse.Namespace) -> list[Topology]:
    out = [Topology("unshaped (CPU floor)", [None] * n, note="no qdisc")]
    out.append(Topology(f"uniform {args.uniform:g}", [args.uniform] * n))
    for seed in args.seeds:
        rng = np.random.default_rng(seed * 100 + n)
        caps = np.clip(rng.lognormal(math.log(args.median), args.sigma, size=n), args.min_cap, args.max_cap)
        fast = 1 if n <= 4 else 2
        caps[:fast] = args.fast
        out.append(Topology(f"random seed {seed}", [round(float(c), 1) for c in caps]))
    if args.two_site and n >= 4:
        half = n // 2
        pair = {(i, j): args.cross for i in range(n) for j in range(n) if (i < half) != (j < half)}
        out.append(
            Topology(
                f"two sites {args.two_site_up:g}/{args.cross:g}",
                [args.two_site_up] * n,
                pair=pair,
                note=f"{half}+{n - half} peers; cross-site pairs {args.cross:g} Mbit/s",
            )
        )
    if args.down_factor:
        for t in out:
            t.down = [None if u is None else u * args.down_factor for u in t.up]
    return out


def capacities(topo: Topology, n: int) -> tuple[np.ndarray, list[float]]:
    """Link matrix (bytes/s, goodput) min(up_u, down_v, pair_uv) and per-peer caps min(up, down)."""
    unshaped = 10_000.0  # Mbit/s stand-in for "no qdisc" (only the plan's shape matters there)

    def bps(mbit: float | None) -> float:
        return (unshaped if mbit is None else mbit) * 1e6 / 8 * GOODPUT

    up = [bps(u) for u in topo.up]
    down = [bps(None if topo.down is None else topo.down[i]) for i in range(n)]
    cap = np.zeros((n, n))
    for u in range(n):
        for v in range(n):
            if u != v:
                cap[u, v] = min(up[u], down[v], bps(topo.pair[(u, v)]) if (u, v) in topo.pair else math.inf)
    return cap, [min(a, b) for a, b in zip(up, down, strict=True)]


@dataclass
class Plans:
    schedule: dict[str, Any]  # JSON form of the AllReduceSchedule, peer indices as strings
    ring: list[int]
    trees: int
    tree_model_s: float
    ring_model_s: float
    hm_model_s: float
    hm_bandwidth: list[float] | None
    rate_mbit: float
    bound_mbit: float


def make_plans(topo: Topology, n: int, nbytes: int, chunk_elements: int) -> Plans:
    from hivemind.averaging.load_balancing import load_balance_peers

    from potluck.coordinator.trees import pack_allreduce, pack_rings
    from potluck.coordinator.trees.plan import (
        choose_tree_plan,
        predict_allreduce_time,
        ring_plan,
        tree_plan,
    )

    cap, node = capacities(topo, n)
    nodes = list(range(n))
    packing = pack_allreduce(cap, node_capacity=node)  # for its rate and certified bound
    # What potluck runs: the packed trees or the one-hop stars, whichever the time model says is faster.
    tplan = choose_tree_plan(nodes, cap, nbytes, chunk_bytes=chunk_elements * 4, node_capacity=node)
    rings = pack_rings(cap, node_capacity=node)
    weight, order = max(rings.rings, key=lambda r: r[0])
    rplan = ring_plan(nodes, [(weight, order)])
    # hivemind is told the same per-peer caps (its `bandwidth`), in Mbit/s; None = equal shares
    hm_bw = None if not topo.shaped else [c * 8 / 1e6 / GOODPUT for c in node]
    sizes = load_balance_peers(nbytes // 4, hm_bw if hm_bw is not None else [None] * n)
    stars = [(float(s), [(c, v) for v in nodes if v != c]) for c, s in enumerate(sizes) if s > 0]
    hplan = tree_plan(nodes, stars)
    chunk = chunk_elements * 4
    return Plans(
        schedule={
            "peers": [str(i) for i in nodes],
            "trees": [
                {
                    "root": str(t.root),
                    "share": t.share,
                    "parent": {str(c): (None if p is None else str(p)) for c, p in t.parent.items()},
                }
                for t in tplan.trees
            ],
        },
        ring=[int(str(v)) for v in order],
        trees=len(tplan.trees),
        tree_model_s=predict_allreduce_time(tplan, nbytes, cap, chunk_bytes=chunk, node_capacity=node),
        ring_model_s=predict_allreduce_time(rplan, nbytes, cap, chunk_bytes=chunk, node_capacity=node),
        hm_model_s=predict_allreduce_time(hplan, nbytes, cap, chunk_bytes=HM_PART_BYTES, node_capacity=node),
        hm_bandwidth=hm_bw,
        rate_mbit=packing.rate * 8 / 1e6,
        bound_mbit=packing.upper_bound * 8 / 1e6,
    )


# ==== worker (one per namespace) =========================================================================


def _input(seed: int, index: int, elements: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(seed * 1000 + index)
    return torch.randn(elements, generator=g)


def worker_main(args: argparse.Namespace) -> None:
    """One peer: a hivemind DHT + DecentralizedAverager + potluck Mailbox; JSON commands on stdin."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints go to the log, not into the protocol stream

    def reply(**kw: Any) -> None:
        proto.write(json.dumps(kw) + "\n")
        proto.flush()

    import asyncio

    import torch

    torch.set_num_threads(1)
    from potluck.compat import use_fork

    use_fork()
    from hivemind import DHT
    from hivemind.averaging import DecentralizedAverager
    from hivemind.averaging.control import AveragingStage
    from hivemind.p2p import PeerID
    from hivemind.utils.multiaddr import Multiaddr

    from potluck.net.config import TransportConfig
    from potluck.net.mailbox import Mailbox
    from potluck.peer.collectives.tree import ring_allreduce, tree_allreduce
    from potluck.peer.config import AllReduceConfig
    from potluck.protocol.collective import AllReduceSchedule, TreeSpec

    n, me = args.n, args.index
    x = _input(args.data_seed, me, args.elements)
    acc = torch.zeros(args.elements, dtype=torch.float64)
    for j in range(n):
        acc += _input(args.data_seed, j, args.elements).double()
    truth = acc / n
    del acc

    def err(t: Any) -> float:
        return float((t.reshape(-1).double() - truth).abs().max())

    dht = DHT(
        initial_peers=json.loads(args.boot) or None,
        start=True,
        host_maddrs=[f"/ip4/{args.addr}/tcp/0"],
        nat_port_map=False,
        auto_nat=False,
        use_relay=False,
    )
    averager = DecentralizedAverager(
        [x.clone()],
        dht,
        start=True,
        prefix="plbench",
        target_group_size=n,
        min_group_size=n,
        min_matchmaking_time=args.matchmaking_s,
        request_timeout=0.75 * args.matchmaking_s,
    )
    # The mailbox's loop runs all the time in its own thread: a peer that has finished its part must
    # keep flushing buffered writes and serving streams while the others finish theirs.
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def wait(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    p2p = wait(dht.replicate_p2p())
    box = Mailbox(p2p, PROTOCOL, TransportConfig(timeout_s=args.timeout))
    wait(box.start())
    names: dict[str, str] = {}  # peer index (as a string) -> base58 peer id
    reply(event="up", peer_id=p2p.peer_id.to_base58(), maddrs=[str(m) for m in dht.get_visible_maddrs()])
    control = None
    cfg = AllReduceConfig(chunk_elements=args.chunk, timeout_s=args.timeout)

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "connect":
                names = {str(k): v["peer_id"] for k, v in enumerate(cmd["peers"])}
                for k, v in enumerate(cmd["peers"]):
                    if k != me:
                        wait(
                            p2p._client.connect(
                                PeerID.from_base58(v["peer_id"]),
                                [Multiaddr(m.split("/p2p/")[0]) for m in v["maddrs"]],
                            )
                        )
                reply(event="ok")
            elif op == "hm_match":
                averager.bandwidth = cmd["bandwidth"]  # read in this process by step()
                with averager.get_tensors() as tensors:
                    tensors[0].copy_(x)
                t0 = time.perf_counter()
                control = averager.step(wait=False, require_trigger=True, timeout=cmd["timeout"])
                while not control.done() and control.stage != AveragingStage.AWAITING_TRIGGER:
                    time.sleep(0.002)
                if control.done():
                    control.result()  # raises the matchmaking error
                reply(event="matched", s=time.perf_counter() - t0)
            elif op == "hm_go":
                assert control is not None
                t0 = time.perf_counter()
                control.allow_allreduce()
                control.result(timeout=cmd["timeout"])
                dt = time.perf_counter() - t0
                with averager.get_tensors() as tensors:
                    e = err(tensors[0])
                control = None
                reply(event="done", s=dt, err=e)
            elif op in ("tree", "ring"):
                if op == "tree":
                    sched = cmd["schedule"]
                    schedule = AllReduceSchedule(
                        tuple(names[p] for p in sched["peers"]),
                        tuple(
                            TreeSpec(
                                names[t["root"]],
                                {names[c]: (None if p is None else names[p]) for c, p in t["parent"].items()},
                                t["share"],
                            )
                            for t in sched["trees"]
                        ),
                    )
                    coro = tree_allreduce(box, schedule, x, cmd["round"], cfg)
                else:
                    order = tuple(names[str(i)] for i in cmd["order"])
                    coro = ring_allreduce(box, order, x, cmd["round"], cfg)
                t0 = time.perf_counter()
                out = wait(coro)
                dt = time.perf_counter() - t0
                reply(event="done", s=dt, err=err(out))
            elif op == "quit":
                break
            else:
                reply(event="error", error=f"unknown op {op}")
        except Exception as e:  # report and keep serving: the driver decides
            reply(event="error", error=f"{type(e).__name__}: {e}")
    with contextlib.suppress(Exception):
        wait(asyncio.wait_for(box.close(), 5.0))
    averager.shutdown()
    dht.shutdown()
    reply(event="bye")
    os._exit(0)  # skip interpreter teardown of the still-running loop thread


# ==== driver =============================================================================================


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
            str(Path(__file__).resolve()),
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


def run_topology(swarm: Swarm, topo: Topology, args: argparse.Namespace, reps: int) -> dict[str, Any]:
    n = swarm.lab.n
    nbytes = args.elements * 4
    plans = make_plans(topo, n, nbytes, args.chunk)
    swarm.lab.shape(topo.up, topo.down, topo.pair)
    worst = max(plans.tree_model_s, plans.ring_model_s, plans.hm_model_s) if topo.shaped else 10.0
    timeout = 10 * worst + 60
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
    # A ring far slower than the tree (two sites: it crosses the slow links) runs once, to save time.
    ring_reps = reps if plans.ring_model_s <= 3 * plans.tree_model_s or not topo.shaped else 1
    for k in range(reps):  # interleaved, so background load hits every method alike
        for m in METHODS:
            if m not in args.methods or (m == "ring" and k >= ring_reps):
                continue
            r = swarm.hivemind(plans, timeout) if m == "hivemind" else swarm._go(m, plans, timeout, 0.0)
            if r["err"] > TOLERANCE or r["warnings"]:
                print(
                    f"    {m} run {k}: max err {r['err']:.2e}; peer log warnings: {r['warnings']}", flush=True
                )
            runs[m].append(r)
    row: dict[str, Any] = {
        "n": n,
        "topology": topo.name,
        "note": topo.note,
        "up_mbit": topo.up,
        "down_mbit": topo.down,
        "pair_mbit": {f"{u}-{v}": r for (u, v), r in topo.pair.items()},
        "mbytes": nbytes / MIB,
        "trees": plans.trees,
        "tree_rate_mbit": plans.rate_mbit,
        "bound_mbit": plans.bound_mbit,
        "tree_model_s": plans.tree_model_s if topo.shaped else None,
        "ring_model_s": plans.ring_model_s if topo.shaped else None,
        "hm_model_s": plans.hm_model_s if topo.shaped else None,
        "runs": runs,
    }
    for m, rs in runs.items():
        ok = [r for r in rs if r["err"] <= TOLERANCE]  # a wrong result is no timing
        row[f"{m}_s"] = statistics.median(r["s"] for r in ok) if ok else None
        row[f"{m}_runs"] = len(rs)
        row[f"{m}_wrong"] = len(rs) - len(ok)
        row[f"{m}_err"] = max((r["err"] for r in rs), default=None)
        row[f"{m}_cpu"] = statistics.median(r["cpu"] for r in ok) if ok else None
        row[f"{m}_cores"] = statistics.median(r["peer_cores"] for r in ok) if ok else None
    hm_ok = [r for r in runs["hivemind"] if r["err"] <= TOLERANCE]
    row["hm_step_s"] = statistics.median(r["s"] + r["match_s"] for r in hm_ok) if hm_ok else None
    row["hm_over_tree"] = _ratio(row["hivemind_s"], row["tree_s"])
    row["ring_over_tree"] = _ratio(row["ring_s"], row["tree_s"])
    return row


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def _f(v: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def caps_text(row: dict[str, Any]) -> str:
    if all(u is None for u in row["up_mbit"]):
        return "none"
    ups = [u for u in row["up_mbit"] if u is not None]
    text = f"{ups[0]:g} each" if len(set(ups)) == 1 else "/".join(f"{u:g}" for u in ups)
    if row["pair_mbit"]:
        text += f"; cross {next(iter(row['pair_mbit'].values())):g}"
    downs = [d for d in row["down_mbit"] or [] if d is not None]
    if downs:
        text += "; down " + (
            f"{downs[0]:g} each" if len(set(downs)) == 1 else "/".join(f"{d:g}" for d in downs)
        )
    return text


def progress(row: dict[str, Any], elapsed: float) -> None:
    models = "/".join(_f(row[k]) for k in ("hm_model_s", "tree_model_s", "ring_model_s"))
    cores = "/".join(_f(row[f"{m}_cores"]) for m in METHODS)
    print(
        f"  {row['topology']:22s} hivemind {_f(row['hivemind_s'])} s  tree {_f(row['tree_s'])} s  "
        f"ring {_f(row['ring_s'])} s  (model {models})  hm/tree {_f(row['hm_over_tree'], '.2f', 'x')}  "
        f"cores {cores}  [{elapsed:.0f} s]",
        flush=True,
    )


def table(rows: list[dict[str, Any]], floor: dict[int, dict[str, float | None]]) -> str:
    head = (
        "| N | topology | upload caps (Mbit/s) | hivemind s | tree s | ring s | hivemind / tree | "
        "hivemind model s | tree model s | ring model s | trees | peers' CPU, cores (hm/tree/ring) | "
        "machine busy (hm/tree/ring) | max err (hm/tree/ring) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        near = []
        for m in METHODS:
            cpu_floor = floor.get(r["n"], {}).get(m)
            if r["tree_model_s"] is not None and cpu_floor and r[f"{m}_s"] and r[f"{m}_s"] < 1.5 * cpu_floor:
                near.append(m)
        cores = "/".join(_f(r[f"{m}_cores"]) for m in METHODS)
        if near:
            cores += " (near the CPU floor: " + ", ".join(near) + ")"
        busy = "/".join(_f(None if r[f"{m}_cpu"] is None else 100 * r[f"{m}_cpu"], ".0f") for m in METHODS)
        errs = []
        for m in METHODS:
            e = _f(r[f"{m}_err"], ".1e")
            if r[f"{m}_wrong"]:
                e += f" (wrong in {r[f'{m}_wrong']} of {r[f'{m}_runs']} runs)"
            errs.append(e)
        times = []
        for m in METHODS:
            t = _f(r[f"{m}_s"])
            if r[f"{m}_runs"] and r[f"{m}_runs"] != r["hivemind_runs"]:
                t += f" ({r[f'{m}_runs']} run{'s' if r[f'{m}_runs'] > 1 else ''})"
            times.append(t)
        lines.append(
            f"| {r['n']} | {r['topology']} | {caps_text(r)} | {' | '.join(times)} | "
            f"{_f(r['hm_over_tree'], '.2f', 'x')} | {_f(r['hm_model_s'])} | {_f(r['tree_model_s'])} | "
            f"{_f(r['ring_model_s'])} | {r['trees']} | {cores} | {busy}% | {' / '.join(errs)} |"
        )
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0], allow_abbrev=False)
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: N=4, 4 MiB, uniform + one random seed, 1 rep"
    )
    ap.add_argument("--peers", type=int, nargs="+", default=None, help="group sizes (default 4 8)")
    ap.add_argument("--mbytes", type=float, default=None, help="fp32 MiB per peer (default 16; quick 4)")
    ap.add_argument(
        "--reps", type=int, default=None, help="timed repetitions per method (default 3; quick 1)"
    )
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="random-cap seeds (default 1 2)")
    ap.add_argument("--uniform", type=float, default=50.0, help="Mbit/s of every peer in the uniform case")
    ap.add_argument("--median", type=float, default=60.0, help="random caps: lognormal median, Mbit/s")
    ap.add_argument("--sigma", type=float, default=0.6, help="random caps: lognormal sigma")
    ap.add_argument("--min-cap", type=float, default=25.0, help="random caps: clipped below at this (Mbit/s)")
    ap.add_argument(
        "--max-cap", type=float, default=200.0, help="random caps: clipped above at this (Mbit/s)"
    )
    ap.add_argument("--fast", type=float, default=300.0, help="Mbit/s of the fast peers (1 if N<=4, else 2)")
    ap.add_argument(
        "--two-site",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add a two-site case (per-pair htb caps across sites); default on unless --quick",
    )
    ap.add_argument("--two-site-up", type=float, default=100.0, help="two-site case: every peer's upload cap")
    ap.add_argument("--cross", type=float, default=10.0, help="two-site case: Mbit/s of each cross-site pair")
    ap.add_argument(
        "--down-factor",
        type=float,
        default=0.0,
        help="download cap = this x upload cap (0: no download caps; every method's per-peer "
        "traffic is symmetric, so a download cap >= the upload cap never binds)",
    )
    ap.add_argument(
        "--queue-ms",
        type=float,
        default=100.0,
        help="every shaped queue holds at most this many ms of data at its rate (tbf latency)",
    )
    ap.add_argument(
        "--chunk",
        type=int,
        default=1 << 17,
        help="potluck: elements per pipeline step over all trees (default 2^17 = 512 KiB, "
        "hivemind's part size; potluck's own default is 2^18)",
    )
    ap.add_argument("--matchmaking-s", type=float, default=2.0, help="hivemind min_matchmaking_time")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-wait timeout inside the collectives")
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument(
        "--hivemind-debug", action="store_true", help="HIVEMIND_LOGLEVEL=DEBUG in the peers (big logs)"
    )
    ap.add_argument(
        "--methods", default=",".join(METHODS), help="comma-separated subset of hivemind,tree,ring"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "bench_vs_hivemind.json")
    ap.add_argument(
        "--keep-logs", action="store_true", help="keep the per-peer logs (kept anyway on failure)"
    )
    # worker mode (internal)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--addr", default="", help=argparse.SUPPRESS)
    ap.add_argument("--elements", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--boot", default="[]", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return args
    args.peers = args.peers or ([4] if args.quick else [4, 8])
    args.mbytes = args.mbytes or (4.0 if args.quick else 16.0)
    args.reps = args.reps or (1 if args.quick else 3)
    args.seeds = args.seeds if args.seeds is not None else ([1] if args.quick else [1, 2])
    args.two_site = (not args.quick) if args.two_site is None else args.two_site
    args.elements = int(args.mbytes * MIB) // 4
    args.methods = tuple(m for m in args.methods.split(",") if m)
    if not args.methods or set(args.methods) - set(METHODS):
        ap.error(f"--methods takes a subset of {','.join(METHODS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.worker:
        worker_main(args)
        return
    from potluck.testbed.netem import Netlab, require_root

    require_root("bench_vs_hivemind.py")

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, on_signal)  # also when started with SIGINT ignored (background jobs)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    logdir = Path(tempfile.mkdtemp(prefix="bench_vs_hivemind-"))
    rows: list[dict[str, Any]] = []
    floor: dict[int, dict[str, float | None]] = {}
    ok = False
    started = time.perf_counter()
    print(
        f"payload {args.mbytes:g} MiB fp32 per peer, {args.reps} rep(s) per method, logs in {logdir}",
        flush=True,
    )
    try:
        for n in args.peers:
            lab = Netlab(n, queue_ms=args.queue_ms)
            swarm = Swarm(lab, args, logdir)
            try:
                lab.create()
                t0 = time.perf_counter()
                swarm.start()
                print(f"N={n}: {n} peers up in {time.perf_counter() - t0:.1f} s", flush=True)
                for k, topo in enumerate(make_topologies(n, args)):
                    if k == 0:  # warm-up: streams opened, allocations made, averager's first round
                        run_topology(swarm, topo, args, 1)
                    row = run_topology(swarm, topo, args, args.reps)
                    if k == 0:
                        floor[n] = {m: row[f"{m}_s"] for m in METHODS}
                    rows.append(row)
                    progress(row, time.perf_counter() - started)
            finally:
                swarm.stop(graceful=sys.exc_info()[0] is None)  # not while an exception propagates
                lab.close()
                left = lab.leftovers()
                if left:
                    print(f"WARNING: namespaces left behind: {left}", file=sys.stderr)
        ok = True
    except KeyboardInterrupt:
        print("\ninterrupted; namespaces and peer processes removed", file=sys.stderr)
        sys.exit(130)
    finally:
        wrong = any(r[f"{m}_wrong"] for r in rows for m in METHODS)
        if not ok or wrong or args.keep_logs:
            print(f"peer logs kept in {logdir}", file=sys.stderr)
        else:
            for f in logdir.iterdir():
                f.unlink()
            logdir.rmdir()
    print()
    print(table(rows, floor))
    bad = [f"N={r['n']} {r['topology']} {m}" for r in rows for m in METHODS if r[f"{m}_wrong"]]
    print(
        f"\ncorrectness (max |result - true mean| <= {TOLERANCE:g} on every peer): "
        + ("every run" if not bad else "WRONG RESULTS in " + "; ".join(bad) + " (left out of the medians)")
    )
    print(f"total {time.perf_counter() - started:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
