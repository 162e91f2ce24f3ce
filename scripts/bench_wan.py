#!/usr/bin/env python3
"""The headline benchmark: one job, the same peers, on fast links and on emulated home links, and
hivemind training the same model on the same home links (issue 15).

Every process runs in a network namespace of its own. Three runs in one invocation:

1. **potluck, fast links**: namespaces on a kernel bridge (``testbed.netem.Netlab``), unshaped (veth:
   several Gbit/s, RTT ~0.05 ms);
2. **potluck, home links**: namespaces joined by the userspace relay (``testbed.wan.WanLab``) with the
   scenario's per-direction delays and rates, checked against the scenario before any training;
3. **hivemind, home links**: ``scripts/wan_hivemind.py`` in the same peer namespaces, pure data parallel
   with ``hivemind.Optimizer`` (fp16 gradient compression), to the same number of tokens.

The coordinator runs in node 0's namespace (a rented server on a good line), the peers in nodes
1..N. The job is the demo's model (4 layers, 128 wide, byte level, 2,048 tokens a step) with the WAN
compression the command line gives (by default none: the coordinator chooses, as for a job file
without a [compression] section); every peer runs one torch thread. Bytes on the wire are
counted at each namespace's interface (IP level, everything: DHT, probes, training). The predicted step
time is the planner's (``predicted (probe)``), and the same model on the same plan with each peer's
speed calibrated from its measured compute (``predicted (calibrated)``): the peers share 2 cores, so
only measured compute reflects what each got of them.

Needs root. Tears everything down on exit, Ctrl+C or SIGTERM.

    sudo .venv/bin/python scripts/bench_wan.py --steps 80 --json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # bench_training's timing report

logger = logging.getLogger("bench_wan")

SCENARIO = "home-train-5"  # potluck/testbed/scenarios/home-train-5.json: node 0 = the coordinator's
PARTS = ("compute", "send", "recv", "allreduce", "idle", "total")


# ==== the job: the demo's model and data, the batch and the compression chosen here ======================


def bench_job(
    steps: int, tokens_per_step: int, compression: dict[str, Any] | str, checkpoint_dir: str, peers: int = 4
) -> dict:
    """The job every run trains (potluck's as a dict, hivemind's written to TOML from the same dict):
    2 stages x peers / 2 replicas."""
    return {
        "name": "wan-bench",
        "seed": 0,
        "steps": steps,
        "min_peers": peers,
        "model": {"n_layers": 4, "d_model": 128, "n_heads": 4, "vocab_size": 256, "seq_len": 64},
        "batch": {"tokens_per_step": tokens_per_step, "micro_batch_size": 4},
        "data": {"source": "generated", "generated_chars": 400_000},
        "optimizer": {"lr": 3e-3, "warmup_steps": 10, "min_lr_ratio": 0.1},
        "compression": compression,
        "checkpoint": {"dir": checkpoint_dir, "interval": max(10, steps // 4), "keep": 2},
        "limits": {"stages": 2, "replicas": max(1, peers // 2)},
    }


def section(text: str) -> dict[str, Any] | str:
    """--compression as the job takes it: "auto", or the section's JSON."""
    return text if text == "auto" else dict(json.loads(text))


def to_toml(doc: dict[str, Any]) -> str:
    """Tables of scalars, as the job file format needs (no arrays of tables)."""

    def value(v: Any) -> str:
        return json.dumps(v) if not isinstance(v, bool) else ("true" if v else "false")

    lines = [f"{k} = {value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines += ["", f"[{k}]", *(f"{kk} = {value(vv)}" for kk, vv in v.items())]
    return "\n".join(lines) + "\n"


# ==== inside node 0's namespace: the coordinator and the peers ==========================================


def potluck_inner(cfg: dict[str, Any]) -> dict[str, Any]:
    """Run the job with the coordinator in this process (node 0) and peer i in node i + 1."""
    from bench_training import timing_report

    from potluck.cli.demo_cmd import run_local_job
    from potluck.compat import use_fork
    from potluck.protocol.jobspec import parse_job

    use_fork()
    run_dir = Path(cfg["run_dir"])
    job = parse_job(cfg["job"], source="bench_wan job")
    prefixes, addrs, access = cfg["prefixes"], cfg["addrs"], cfg.get("access")
    nat = cfg.get("nat") or []  # per node: "", "cone" or "symmetric" (home runs with --nat)

    def placement(name: str) -> tuple[tuple[str, ...], str]:
        node = 0 if name == "coordinator" else int(name.removeprefix("peer")) + 1
        return tuple(prefixes[node]), f"/ip4/{addrs[node]}/tcp/0"

    def extra(i: int) -> tuple[str, ...]:
        # Link probes long enough to leave TCP's slow start behind on 50-100 ms round trips (1 MiB: 1.7 s
        # at 5 Mbit/s), measured once at the start and then every 5 minutes (not the demo's 30 s: on a
        # 5 Mbit/s uplink every probe is training traffic lost).
        probes: tuple[str, ...] = ("--link-probe-bytes", str(1 << 20), "--link-interval", "300")
        if nat:  # NATed peers reserve relay slots on the coordinator; the others are public
            probes += ("--reachability", "private" if nat[i + 1] else "public")
        if not access:
            return probes
        up, down = access[i + 1]
        return (*probes, "--upload-mbps", f"{up:g}", "--download-mbps", f"{down:g}")

    start = time.monotonic()
    summary, watcher = asyncio.run(
        run_local_job(
            job,
            run_dir,
            cfg["timeout"],
            1,
            placement=placement,
            peer_extra=extra,
            reachability="public" if nat else "auto",
        )
    )
    wall = time.monotonic() - start
    plan = watcher.plan
    assert plan is not None
    # Short runs (tests) keep their later half.
    report = timing_report(watcher, job, min(cfg["skip"], cfg["steps"] // 2))
    losses = dict(sorted(watcher.losses.items()))
    tail = [v for s, v in losses.items() if s > 0.9 * cfg["steps"]]
    return {
        **summary,
        "wall_s": round(wall, 1),
        "tokens": summary["steps"] * job.batch.tokens_per_step,  # type: ignore[operator]
        "loss_tail_mean": statistics.mean(tail) if tail else None,
        "losses": losses,
        **report,
        "stages": len(plan.stages),
        "replicas": plan.n_replicas,
        "layers": [st.last_layer - st.first_layer for st in plan.stages],
        "run_ahead": plan.run_ahead,
        "micro_batches": plan.micro_batches,
        # compression = "auto": what the coordinator chose for the last plan (None: the job's section)
        "chosen": plan.compression.model_dump(mode="json") if plan.compression is not None else None,
        **(nat_report(run_dir, plan, watcher, nat) if nat else {}),
    }


def nat_report(run_dir: Path, plan: Any, watcher: Any, nat: list[str]) -> dict[str, Any]:
    """Behind-NAT peers: where the plan put each (None: left out), the links their probes found
    relayed, and which of the plan's bulk pairs (pipeline neighbours, replicas of a stage) are relayed."""
    from potluck.protocol.identity import Identity

    names = {
        Identity.load_or_create(run_dir / f"peer{i}" / "identity.pem").peer_id: f"peer{i}"
        for i in range(len(nat) - 1)
    }
    relayed = sorted(
        {
            tuple(sorted((names.get(r, r[-6:]), names.get(s.dst, s.dst[-6:]))))
            for r, rep in watcher.swarm_state.links.items()
            for s in rep.links
            if s.relayed
        }
    )
    bulk = set()
    for st in plan.stages:  # replicas of a stage all-reduce with each other
        bulk |= {tuple(sorted((a, b))) for k, a in enumerate(st.peers) for b in st.peers[k + 1 :]}
    for a, b in zip(plan.stages, plan.stages[1:], strict=False):  # pipeline neighbours, per replica
        bulk |= {tuple(sorted(pair)) for pair in zip(a.peers, b.peers, strict=True)}
    bulk_names = {tuple(sorted((names.get(a, a), names.get(b, b)))) for a, b in bulk}
    return {
        "nat": {f"peer{i - 1}": kind for i, kind in enumerate(nat) if i > 0 and kind},
        "placed": {name: plan.position(pid) for pid, name in names.items()},
        "relayed_links": [list(p) for p in relayed],
        "relayed_bulk_pairs": [list(p) for p in sorted(bulk_names & set(relayed))],
    }


# ==== the driver (root namespace) ========================================================================


def iface_bytes(prefix: list[str], dev: str) -> tuple[int, int]:
    """(tx, rx) bytes of ``dev`` inside the namespace ``prefix`` enters."""
    out = []
    for what in ("tx_bytes", "rx_bytes"):
        cmd = [*prefix, "cat", f"/sys/class/net/{dev}/statistics/{what}"]
        out.append(int(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout))
    return out[0], out[1]


def stop(proc: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    """End a child we started, by PID: SIGTERM, ``grace_s`` to exit, then SIGKILL; always reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_potluck(
    label: str,
    spawn: Any,
    prefixes: list[list[str]],
    addrs: list[str],
    dev: str,
    args: argparse.Namespace,
    access: list[tuple[float, float]] | None,
    nat: list[str] | None = None,
) -> dict[str, Any]:
    """Start ``potluck_inner`` in node 0 through ``spawn`` (the lab's, so the lab reaps it) and wait."""
    with tempfile.TemporaryDirectory(prefix=f"potluck-wan-{label}-") as tmp:
        cfg = {
            "run_dir": tmp,
            "steps": args.steps,
            "skip": args.skip,
            "timeout": args.timeout,
            "prefixes": prefixes,
            "addrs": addrs,
            "access": access,
            "nat": nat,
            "job": bench_job(
                args.steps, args.tokens_per_step, section(args.compression), f"{tmp}/ckpt", len(addrs) - 1
            ),
        }
        cfg_file, out_file = Path(tmp) / "cfg.json", Path(tmp) / "result.json"
        cfg_file.write_text(json.dumps(cfg))
        before = [iface_bytes(p, dev) for p in prefixes]
        log = open(Path(tmp) / "inner.log", "wb")  # noqa: SIM115 (closed below)
        proc = spawn(
            0,
            [sys.executable, __file__, "--inner", str(cfg_file), "--inner-out", str(out_file)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            rc = proc.wait(timeout=args.timeout + 120)
        except subprocess.TimeoutExpired:
            rc = -1
        finally:  # its peers die with it (lifeline); ours to reap, by PID
            stop(proc)
            log.close()
        after = [iface_bytes(p, dev) for p in prefixes]
        if args.keep_logs:  # every process's log, for a look at what went wrong (or right)
            shutil.copytree(
                tmp, args.keep_logs / label, ignore=shutil.ignore_patterns("ckpt"), dirs_exist_ok=True
            )
        if rc != 0 or not out_file.exists():
            tail = (Path(tmp) / "inner.log").read_text(errors="replace")[-4000:]
            raise RuntimeError(f"potluck run {label!r} failed (rc {rc}):\n{tail}")
        result = json.loads(out_file.read_text())
    sent = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
    result["label"] = label
    result["wire_bytes_sent"] = sum(sent)
    result["wire_bytes_per_step"] = sum(sent) / max(result["steps"], 1)
    result["wire_bytes_sent_per_node"] = sent
    return result


def run_hivemind(lab: Any, args: argparse.Namespace, tokens: int) -> dict[str, Any]:
    """``scripts/wan_hivemind.py`` in nodes 1..N of ``lab`` (node 1 first, the rest bootstrap from it),
    to ``tokens`` tokens; the swarm's summary plus tokens/s between its first and last full epoch."""
    from potluck.testbed.baseline.summary import read_records, swarm_summary

    n = lab.spec.n
    worker = [sys.executable, str(ROOT / "scripts" / "wan_hivemind.py")]
    with tempfile.TemporaryDirectory(prefix="potluck-wan-hivemind-") as tmp:
        outs = [Path(tmp) / f"p{i}.jsonl" for i in range(1, n)]
        logs = [open(Path(tmp) / f"p{i}.log", "wb") for i in range(1, n)]  # noqa: SIM115 (closed below)
        job_file = Path(tmp) / "job.toml"
        job_file.write_text(to_toml(bench_job(args.steps, args.tokens_per_step, {}, f"{tmp}/ckpt", n - 1)))
        common = [
            "--n-peers",
            str(n - 1),
            "--tokens",
            str(tokens),
            "--compression",
            args.hivemind_compression,
            "--threads",
            "1",
            "--job",
            str(job_file),
            *args.hivemind_args.split(),
        ]
        before = [iface_bytes(lab.exec_prefix(i), "tun0") for i in range(n)]
        procs = []
        try:
            first = lab.spawn(
                1,
                [
                    *worker,
                    "--host",
                    lab.addr(1),
                    "--peer-index",
                    "0",
                    *common,
                    "--out",
                    str(outs[0]),
                    "--print-maddrs",
                ],
                stdout=subprocess.PIPE,
                stderr=logs[0],
            )
            procs.append(first)
            line = _read_line(first, 120.0)
            maddrs = json.loads(line)["maddrs"]
            for i in range(2, n):
                procs.append(
                    lab.spawn(
                        i,
                        [
                            *worker,
                            "--host",
                            lab.addr(i),
                            "--initial-peers",
                            *maddrs,
                            "--peer-index",
                            str(i - 1),
                            *common,
                            "--out",
                            str(outs[i - 1]),
                        ],
                        stdout=logs[i - 1],
                        stderr=subprocess.STDOUT,
                    )
                )
            deadline = time.monotonic() + args.timeout
            for proc in procs:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            for proc in procs:
                stop(proc)
            for f in logs:
                f.close()
        after = [iface_bytes(lab.exec_prefix(i), "tun0") for i in range(n)]
        rcs = [proc.returncode for proc in procs]
        if any(rc != 0 for rc in rcs):
            tail = (Path(tmp) / "p1.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"hivemind workers exited with {rcs}:\n{tail}")
        records = [read_records(o) for o in outs]
    summary = swarm_summary(records)
    # Steady state, as potluck's tokens/s: from the first full epoch to the last (start-up left out).
    full = [c for c in summary["curve"] if c["peers"] == n - 1]
    curve = [(c["tokens"], c["time"], c["loss"]) for c in full]
    steady = None  # tokens are cumulative: the swarm's tokens between the first and last full epoch
    if len(curve) >= 2 and curve[-1][1] > curve[0][1]:
        steady = (curve[-1][0] - curve[0][0]) / (curve[-1][1] - curve[0][1])
    tail = [c[2] for c in curve[-max(1, len(curve) // 10) :]]
    sent = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
    return {
        **summary,
        "label": "hivemind",
        "tokens_per_s_steady": steady,
        "loss_tail_mean": statistics.mean(tail) if tail else None,
        "losses": [(c[0], c[2]) for c in curve],
        "wire_bytes_sent": sum(sent),
        "wire_bytes_sent_per_node": sent,
    }


def loss_at(curve: list[tuple[float, float]], tokens: float) -> float | None:
    """The loss at ``tokens`` on a (cumulative tokens, loss) curve, linear between its points."""
    pts = sorted(curve)
    if not pts or tokens < pts[0][0]:
        return None
    for (t0, l0), (t1, l1) in itertools.pairwise(pts):
        if t0 <= tokens <= t1:
            return l0 + (l1 - l0) * (tokens - t0) / max(t1 - t0, 1e-9)
    return pts[-1][1] if tokens <= pts[-1][0] * 1.05 else None


def compared_tokens(potluck_tokens: int, hivemind: dict[str, Any] | None) -> int:
    """The tokens both systems' losses are read at: potluck's, or fewer where hivemind's run ended
    short of them (more than the 5% ``loss_at`` extrapolates over)."""
    if not hivemind or not hivemind.get("losses"):
        return potluck_tokens
    reached = max(int(t) for t, _ in hivemind["losses"])
    return reached if reached * 1.05 < potluck_tokens else potluck_tokens


def smoothed(curve: list[tuple[float, float]], window: int = 4) -> list[tuple[float, float]]:
    """Each point's loss as the mean of the last ``window`` points' (training losses are noisy)."""
    pts = sorted(curve)
    return [
        (t, statistics.mean(v for _, v in pts[max(0, k - window + 1) : k + 1]))
        for k, (t, _) in enumerate(pts)
    ]


def _read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    """The first line a child prints on stdout, within ``timeout_s``."""
    import select

    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline().decode() if ready else ""
    if not line.strip():
        raise RuntimeError(f"hivemind's first peer printed no multiaddrs within {timeout_s:.0f} s")
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--skip", type=int, default=5, help="leading steps left out of the step-time means")
    ap.add_argument("--timeout", type=float, default=1500.0, help="per run, seconds")
    ap.add_argument("--scenario", default=SCENARIO)
    ap.add_argument(
        "--compression",
        default="auto",
        help="the job's [compression] section as JSON (the same in every potluck run); 'auto' (the "
        "default, what a job file without the section gets): the coordinator chooses per plan",
    )
    ap.add_argument("--only", choices=["fast", "home", "hivemind"], nargs="+", default=None)
    ap.add_argument("--hivemind-compression", choices=["fp16", "8bit", "none"], default="fp16")
    ap.add_argument("--tokens-per-step", type=int, default=8192, help="the job's global batch, tokens")
    ap.add_argument("--no-check", action="store_true", help="skip measuring the links first (tests)")
    ap.add_argument("--hivemind-args", default="", help="more flags for every hivemind worker")
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    ap.add_argument("--keep-logs", type=Path, help="copy each potluck run's logs to DIR/<run>")
    ap.add_argument(
        "--nat",
        default="",
        help="home nodes behind a NAT, e.g. '2:cone,4:symmetric' (node 0 is the coordinator's, node i+1 "
        "peer i's); they join with --reachability private, the rest with public",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "bench_wan.json")
    ap.add_argument("--inner", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--inner-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.inner:
        args.inner_out.write_text(json.dumps(potluck_inner(json.loads(args.inner.read_text()))))
        return
    from potluck.testbed.netem import Netlab
    from potluck.testbed.wan.check import measure
    from potluck.testbed.wan.lab import WanLab, require_support, sigterm_raises
    from potluck.testbed.wan.spec import load_spec, parse_nat, with_nat

    require_support()
    spec = load_spec(args.scenario)
    if args.nat:
        spec = with_nat(spec, parse_nat(args.nat))
    n = spec.n
    access = [(spec.up_mbps[i], spec.down_mbps[i]) for i in range(n)]
    runs = args.only or ["fast", "home", "hivemind"]
    out: dict[str, Any] = {"scenario": spec.name, "steps": args.steps, "compression": args.compression}
    if "fast" in runs:
        with Netlab(n) as net:

            def spawn(i: int, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
                from potluck.lifeline import after_spawn, preexec

                p = subprocess.Popen(
                    [*net.exec_prefix(i), *argv], preexec_fn=preexec(), start_new_session=True, **kw
                )
                after_spawn(p.pid)
                return p

            prefixes = [net.exec_prefix(i) for i in range(n)]
            out["fast"] = run_potluck("fast", spawn, prefixes, net.addrs, "eth0", args, None)
            logger.info("fast: %s tokens/s", out["fast"]["tokens_per_s"])
    if "home" in runs or "hivemind" in runs:
        with sigterm_raises(), WanLab(spec) as lab:  # a SIGTERM tears the lab down like Ctrl+C
            if not args.no_check:
                report = measure(lab)
                out["links"] = report.to_json()
                logger.info("links ok: %s", report.ok)
                if not report.ok:
                    raise SystemExit(
                        f"the emulated links are off the scenario: {json.dumps(report.to_json())}"
                    )
            prefixes = [lab.exec_prefix(i) for i in range(n)]
            addrs = [lab.local_addr(i) for i in range(n)]  # where each listens (private behind a NAT)
            if "home" in runs:
                cpu0 = lab.relay_cpu_s()
                nat = [spec.nat_of(i) for i in range(n)] if spec.nat else None
                out["home"] = run_potluck("home", lab.spawn, prefixes, addrs, "tun0", args, access, nat)
                out["home"]["relay_cpu_s"] = lab.relay_cpu_s() - cpu0
                logger.info("home: %s tokens/s", out["home"]["tokens_per_s"])
            if "hivemind" in runs:
                tokens = args.steps * args.tokens_per_step  # the same tokens as potluck's runs
                cpu0 = lab.relay_cpu_s()
                out["hivemind"] = run_hivemind(lab, args, tokens)
                out["hivemind"]["relay_cpu_s"] = lab.relay_cpu_s() - cpu0
                logger.info("hivemind: %s tokens/s", out["hivemind"]["tokens_per_s_steady"])
    head = {}
    if "fast" in out and "home" in out:
        head["wan_slowdown"] = out["fast"]["tokens_per_s"] / out["home"]["tokens_per_s"]
    # Loss after the same tokens: each system's training loss, smoothed over its last 4 points, at the
    # tokens potluck trained (hivemind's computed tokens: it overshoots its target batch most epochs),
    # or at hivemind's last point where it fell short of them (12-07: 592,128 of 655,360)
    tokens = compared_tokens(args.steps * args.tokens_per_step, out.get("hivemind"))
    head["tokens_compared"] = tokens
    if "home" in out:
        pl = smoothed([(int(s) * args.tokens_per_step, v) for s, v in out["home"]["losses"].items()])
        head["loss_potluck"] = loss_at(pl, tokens)
        errors = [out[k]["calibrated_error"] for k in ("fast", "home") if k in out]
        # None: a peer's timings were never read, so that run has no calibrated figure
        head["prediction_error_max"] = None if None in errors else max(abs(e) for e in errors)
    if "hivemind" in out:
        head["loss_hivemind"] = loss_at(smoothed([(t, v) for t, v in out["hivemind"]["losses"]]), tokens)
        if "home" in out and out["hivemind"]["tokens_per_s_steady"]:
            head["vs_hivemind"] = out["home"]["tokens_per_s"] / out["hivemind"]["tokens_per_s_steady"]
    out["headline"] = head
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    # The details to stderr when --json asks for one JSON line on stdout (the whole run is in --out).
    detail = json.dumps({k: out[k] for k in out if k not in ("links",)}, indent=1, default=str)[:6000]
    print(detail, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(head))


if __name__ == "__main__":
    main()
