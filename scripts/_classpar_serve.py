"""Coded class-parallel serving over worker processes, one of them killed (issue 20, serving on loopback).

Worker ``j`` of an ``ErasureCode`` is a spawned single-threaded process holding the sub-networks in
row ``j``'s support. A systematic worker returns its group's |g| float32 scores; a parity worker
evaluates every unit of its support and returns sum_i G[j, i] * s_i in float64. The client writes each
query to every live worker at once, and ``fanout.first_decodable`` decodes from the first replies that
determine all units; replies carry the query id so that a late reply to an old query is dropped. One
worker is killed (SIGKILL, by the pid this script started) before the queries: its pipe reports EOF,
it counts as a straggler that never answers, and the answers must not change.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import statistics
import struct
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

import numpy as np
import torch
import torch.nn.functional as F

from potluck.classpar.code import ErasureCode
from potluck.classpar.fanout import first_decodable
from potluck.classpar.merge import merge_scores
from potluck.classpar.subnet import Subnet

_QID = struct.Struct("<q")  # 8-byte query id in front of every request and reply


def _worker(
    conn: Connection, models: list[torch.nn.Module], coeffs: list[float], shape: tuple[int, ...]
) -> None:
    torch.set_num_threads(1)
    systematic = len(models) == 1 and coeffs[0] == 1.0
    with torch.no_grad():
        while True:
            msg = conn.recv_bytes()
            if not msg:
                return
            x = torch.frombuffer(bytearray(msg[_QID.size :]), dtype=torch.float32).reshape(shape)
            scores = [F.softmax(m.eval()(x), dim=1)[0, 1:].numpy() for m in models]
            if systematic:
                out = scores[0].astype(np.float32).tobytes()
            else:
                out = sum(c * s.astype(np.float64) for c, s in zip(coeffs, scores, strict=True)).tobytes()
            conn.send_bytes(msg[: _QID.size] + out)


class CodedPool:
    """One process per coded worker; ``ask`` returns one awaitable reply per worker."""

    def __init__(self, code: ErasureCode, subnets: Sequence[Subnet], shape: tuple[int, ...]) -> None:
        ctx = mp.get_context("spawn")
        self.code = code
        self.conns: list[Connection] = []
        self.procs: list[mp.process.BaseProcess] = []
        for j in range(code.n):
            support = code.support(j)
            ours, theirs = ctx.Pipe()
            args = (
                theirs,
                [subnets[i].model for i in support],
                [float(code.generator[j, i]) for i in support],
                shape,
            )
            proc = ctx.Process(target=_worker, args=args, daemon=True)
            proc.start()
            self.conns.append(ours)
            self.procs.append(proc)
        warm = _QID.pack(0) + torch.zeros(shape).numpy().tobytes()
        for conn in self.conns:  # wait until every worker has started and answered once (spawn: seconds)
            conn.send_bytes(warm)
        for conn in self.conns:
            conn.recv_bytes()
        self.dtypes = [np.float32 if code.weights()[j] == 1 else np.float64 for j in range(code.n)]
        self.waiting: dict[int, asyncio.Future[np.ndarray]] = {}
        self.dead: set[int] = set()
        self.qid = 0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for j, conn in enumerate(self.conns):
            loop.add_reader(conn.fileno(), self._readable, j)

    def _readable(self, j: int) -> None:
        try:
            msg = self.conns[j].recv_bytes()
        except (EOFError, OSError):  # the worker died: fail its pending reply, stop watching its pipe
            asyncio.get_running_loop().remove_reader(self.conns[j].fileno())
            self.dead.add(j)
            fut = self.waiting.pop(j, None)
            if fut is not None and not fut.done():
                fut.set_exception(ConnectionError(f"worker {j} is gone"))
            return
        (qid,) = _QID.unpack_from(msg)
        fut = self.waiting.get(j)
        if qid == self.qid and fut is not None and not fut.done():  # else: a late reply to an old query
            fut.set_result(np.frombuffer(msg[_QID.size :], dtype=self.dtypes[j]).astype(np.float64))

    def ask(self, x: torch.Tensor) -> list[asyncio.Future[np.ndarray]]:
        loop = asyncio.get_running_loop()
        self.qid += 1
        payload = _QID.pack(self.qid) + x.contiguous().numpy().tobytes()
        futs: list[asyncio.Future[np.ndarray]] = []
        for j, conn in enumerate(self.conns):
            fut: asyncio.Future[np.ndarray] = loop.create_future()
            self.waiting[j] = fut
            try:
                if j in self.dead:
                    raise ConnectionError(f"worker {j} is gone")
                conn.send_bytes(payload)
            except (OSError, ConnectionError) as exc:
                self.dead.add(j)
                fut.set_exception(ConnectionError(str(exc)))
            futs.append(fut)
        return futs

    def close(self) -> None:
        for j, conn in enumerate(self.conns):
            if j not in self.dead:
                with contextlib.suppress(OSError):
                    conn.send_bytes(b"")
        for proc in self.procs:
            proc.join(timeout=10)


async def _serve(
    pool: CodedPool, groups: list[list[int]], x: torch.Tensor, kill: int | None
) -> tuple[list[int], float]:
    pool.start()
    if kill is not None:
        pool.procs[kill].kill()  # SIGKILL to the pid this script started
        pool.procs[kill].join(timeout=10)
    preds: list[int] = []
    times: list[float] = []
    for q in range(len(x)):
        t0 = time.perf_counter()
        units, _ = await first_decodable(pool.code, pool.ask(x[q : q + 1]), timeout_s=10.0)
        blocks = [torch.from_numpy(units[i][None]) for i in range(len(groups))]
        preds.append(int(merge_scores(blocks, groups).argmax(dim=1)[0]))
        times.append(time.perf_counter() - t0)
    return preds, 1e3 * statistics.median(times)


def serve_with_killed(
    code: ErasureCode, subnets: Sequence[Subnet], x: torch.Tensor, kill: int
) -> dict[str, object]:
    """Predictions and median latency (ms) of ``x`` with all workers alive, then with worker ``kill`` dead."""
    groups = [s.group for s in subnets]
    out: dict[str, object] = {}
    for name, victim in (("alive", None), ("killed", kill)):
        pool = CodedPool(code, subnets, (1, *x.shape[1:]))
        try:
            preds, ms = asyncio.run(_serve(pool, groups, x, victim))
        finally:
            pool.close()
        out[f"serve_{name}_preds"], out[f"serve_{name}_ms"] = preds, ms
    return out
