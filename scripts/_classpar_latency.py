"""Single-input latency of class-parallel serving on single-threaded worker processes (S3, S4).

Each worker is a spawned process running one model with ``torch.set_num_threads(1)``; the client sends
the input's bytes over a pipe and waits for the reply's bytes. Three set-ups share this transport so
their difference is the model work: the baseline (one process, the whole CNN, K floats back), class
parallel (G processes, one sub-network each, |g| floats back from each, all asked at once), and a
2-stage model-parallel split (stage 1's activation goes back through the client to stage 2). Rounds
interleave the set-ups so that load from other processes on the machine hits them alike.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

import torch
import torch.nn.functional as F

from potluck.classpar.model import POOL_AFTER, SmallCNN

SPLIT_AT = 2  # stage 1 runs convolutions 0..1 (and the pool after 1)


def _run(model: SmallCNN, x: torch.Tensor, layers: range) -> torch.Tensor:
    for i in layers:
        x = F.relu(model.bns[i](model.convs[i](x)))
        if i in POOL_AFTER:
            x = F.max_pool2d(x, 2)
    return x


def _apply(model: SmallCNN, role: str, x: torch.Tensor) -> torch.Tensor:
    if role == "stage1":
        return _run(model, x, range(SPLIT_AT))
    if role == "stage2":
        x = _run(model, x, range(SPLIT_AT, len(model.widths)))
        return F.softmax(model.fc(x.mean(dim=(2, 3))), dim=1)
    out = F.softmax(model(x), dim=1)
    return out[:, 1:] if role == "subnet" else out


def _serve(conn: Connection, model: SmallCNN, role: str, shape: tuple[int, ...]) -> None:
    torch.set_num_threads(1)
    model.eval()
    with torch.no_grad():
        while True:
            msg = conn.recv_bytes()
            if not msg:
                return
            x = torch.frombuffer(bytearray(msg), dtype=torch.float32).reshape(shape)
            conn.send_bytes(_apply(model, role, x).contiguous().numpy().tobytes())


class Pool:
    """Worker processes, one per (model, role, input shape)."""

    def __init__(self, jobs: Sequence[tuple[SmallCNN, str, tuple[int, ...]]]) -> None:
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs: list[mp.process.BaseProcess] = []
        for model, role, shape in jobs:
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(theirs, model, role, shape), daemon=True)
            proc.start()
            self.conns.append(ours)
            self.procs.append(proc)

    def close(self) -> None:
        for conn in self.conns:
            conn.send_bytes(b"")
        for proc in self.procs:
            proc.join(timeout=10)


def fan_out(pool: Pool, payload: bytes) -> int:
    """Ask every worker at once; returns the reply bytes."""
    for conn in pool.conns:
        conn.send_bytes(payload)
    return sum(len(conn.recv_bytes()) for conn in pool.conns)


def chain(pool: Pool, payload: bytes) -> tuple[int, int]:
    """Stage 1 then stage 2 through the client; returns (activation bytes, reply bytes)."""
    pool.conns[0].send_bytes(payload)
    act = pool.conns[0].recv_bytes()
    pool.conns[1].send_bytes(act)
    return len(act), len(pool.conns[1].recv_bytes())


def in_process_ms(model: SmallCNN, x: torch.Tensor, repeats: int) -> float:
    """Median single-input forward time on this (single-threaded) process, milliseconds."""
    times = []
    with torch.no_grad():
        model.eval()
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def measure(
    baseline: SmallCNN, subnets: Sequence[SmallCNN], x: torch.Tensor, *, rounds: int = 10, per_round: int = 40
) -> dict[str, float]:
    """Median single-input latencies (ms) of baseline, class-parallel and split serving, and bytes."""
    shape = tuple(x.shape)
    act_shape = (1, baseline.widths[SPLIT_AT - 1], shape[2] // 2, shape[3] // 2)
    pools = {
        "baseline": Pool([(baseline, "full", shape)]),
        "class_parallel": Pool([(m, "subnet", shape) for m in subnets]),
        "split": Pool([(baseline, "stage1", shape), (baseline, "stage2", act_shape)]),
    }
    samples: dict[str, list[float]] = {name: [] for name in pools}
    payload = x.contiguous().numpy().tobytes()
    sizes: dict[str, float] = {}
    try:
        for name, pool in pools.items():  # warm up: first calls allocate
            for _ in range(20):
                fan_out(pool, payload) if name != "split" else chain(pool, payload)
        for _ in range(rounds):
            for name, pool in pools.items():
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    if name == "split":
                        act, reply = chain(pool, payload)
                        sizes["split_activation_bytes"], sizes["split_reply_bytes"] = act, reply
                    else:
                        sizes[f"{name}_reply_bytes"] = fan_out(pool, payload)
                    samples[name].append(time.perf_counter() - t0)
    finally:
        for pool in pools.values():
            pool.close()
    out = {f"{name}_ms": 1e3 * statistics.median(s) for name, s in samples.items()}
    return out | sizes
