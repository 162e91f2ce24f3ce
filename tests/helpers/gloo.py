"""Reference all-reduce with torch.distributed (gloo on loopback) in forked processes."""

from __future__ import annotations

import multiprocessing as mp
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist


def _worker(rank: int, world: int, store: str, inp: Path, out: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        x = torch.load(inp)
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        torch.save(x / world, out)
    finally:
        dist.destroy_process_group()


def gloo_mean(tensors: list[torch.Tensor], timeout_s: float = 60.0) -> torch.Tensor:
    """The mean of ``tensors`` as gloo's all_reduce computes it (rank 0's copy)."""
    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        procs = []
        for rank, t in enumerate(tensors):
            torch.save(t, root / f"in{rank}.pt")
            p = ctx.Process(
                target=_worker,
                args=(rank, len(tensors), str(root / "store"), root / f"in{rank}.pt", root / f"out{rank}.pt"),
            )
            p.start()
            procs.append(p)
        for p in procs:
            p.join(timeout_s)
            if p.is_alive():
                p.kill()
                p.join()
            assert p.exitcode == 0, f"gloo worker exited with {p.exitcode}"
        return torch.load(root / "out0.pt")
