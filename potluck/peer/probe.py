"""Hardware probe: which device, how much memory, and how fast it multiplies matrices (measured).

The planner places stages by these numbers, so they are measured, never looked up: a short dense matmul
loop per dtype, timed after a warm-up, bounded by ``budget_s`` so start-up stays quick. ``apply_caps``
then lowers them to what the volunteer offers (``--threads``, ``--max-memory``).
"""

from __future__ import annotations

import logging
import os
import threading
import time

import torch

from potluck.model.device import cap_memory, resolve_device, use_device
from potluck.protocol.records import DeviceKind, Hardware

logger = logging.getLogger(__name__)


def pick_device(requested: str = "auto") -> torch.device:
    """``auto``: CUDA (or ROCm) when present, then Apple MPS, else CPU; a named device must exist
    (``DeviceError`` otherwise). The chosen CUDA card becomes this process's current device."""
    device = resolve_device(requested)
    use_device(device)
    return device


def matmul_tflops(
    device: torch.device, dtype: torch.dtype, budget_s: float, size: int | None = None
) -> float:
    """Dense ``size x size`` matmul throughput in TFLOP/s (2 n^3 FLOP per product), measured."""
    n = size or (4096 if device.type == "cuda" else 512)
    try:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        torch.matmul(a, b)  # warm-up: kernels selected, memory touched
        _sync(device)
        reps, start = 0, time.perf_counter()
        while True:
            torch.matmul(a, b)
            reps += 1
            # A GPU syncs every 4th product (a sync costs); a CPU product is synchronous and may be slow
            # (bf16 without hardware support: 0.2 s for n = 512 here), so the budget is checked each time.
            if reps % 4 == 0 or device.type == "cpu":
                _sync(device)
                elapsed = time.perf_counter() - start
                if elapsed >= budget_s:
                    break
        return 2.0 * n**3 * reps / elapsed / 1e12
    except (RuntimeError, TypeError) as e:  # a dtype the device lacks counts as zero throughput
        logger.info("matmul %s on %s unsupported: %s", dtype, device, e)
        return 0.0


def pair_speedup(
    device: torch.device, budget_s: float, size: int | None = None, threads: int | None = None
) -> float:
    """Two waves' throughput over one wave's on ``device``: the fp32 matmul probe run alone, then on two
    threads at once (each as the trainer's waves run: its own Python thread, torch's thread pool shared),
    in products per second. Near 1: one wave fills the device; near 2: a second wave's compute is free.
    Clipped to (0, 2]: more than 2 is noise on a busy machine. ``threads``: torch's CPU threads for the
    probe (restored after), as each of two processes sharing the device trains with."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        one = matmul_tflops(device, torch.float32, budget_s, size)
        rates = [0.0, 0.0]

        def wave(i: int) -> None:
            rates[i] = matmul_tflops(device, torch.float32, budget_s, size)

        waves = [threading.Thread(target=wave, args=(i,), name=f"pair-probe-{i}") for i in range(2)]
        for t in waves:
            t.start()
        for t in waves:
            t.join()
    finally:
        torch.set_num_threads(before)
    if one <= 0.0:
        return 1.0
    return round(min(2.0, max(1e-3, sum(rates) / one)), 3)


def probe(
    device: torch.device,
    budget_s: float = 0.5,
    slots: int = 1,
    pair: bool = False,
    threads: int | None = None,
) -> Hardware:
    """Describe this machine; ``budget_s`` bounds each of the two matmul benchmarks (and, for a peer
    measuring the pair speedup (``pair``: a peer offering two slots or sharing its device with a
    co-tenant, unless its owner declared the figure), each half of the pair probe), at ``threads`` when
    given (a shared device: the threads each of its two peer processes trains with)."""
    kind: DeviceKind
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        name = torch.cuda.get_device_name(device)
        kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
    else:
        total, free = _system_memory()
        name = _cpu_name() if device.type == "cpu" else device.type
        kind = "mps" if device.type == "mps" else "xpu" if device.type == "xpu" else "cpu"
    fp32 = matmul_tflops(device, torch.float32, budget_s) if budget_s > 0 else 0.0
    bf16 = matmul_tflops(device, torch.bfloat16, budget_s) if budget_s > 0 else 0.0
    hw = Hardware(
        device_kind=kind,
        device_name=name[:128],
        memory_total_bytes=int(total),
        memory_free_bytes=int(min(free, total)),
        cpu_cores=max(1, cores),
        tflops_fp32=round(fp32, 4),
        tflops_bf16=round(bf16, 4),
        slots=slots,
        pair_speedup=pair_speedup(device, budget_s, threads=threads) if pair and budget_s > 0 else None,
    )
    logger.info("probed %s: %.3f TFLOP/s fp32, %.3f bf16", hw.device_name, fp32, bf16)
    if hw.pair_speedup is not None:
        logger.info("two at once run at %.2fx the throughput of one", hw.pair_speedup)
    return hw


def apply_caps(
    hw: Hardware, threads: int | None, max_memory_bytes: int | None, device: torch.device | None = None
) -> Hardware:
    """Apply --threads and --max-memory: the swarm plans with what this peer offers, not all it has.
    The record announces at most ``max_memory_bytes`` free (the planner fits stages into it), and on
    CUDA the caching allocator of ``device`` is capped at that share of the card."""
    if threads is not None:
        torch.set_num_threads(threads)
    if max_memory_bytes is None:
        return hw
    if hw.device_kind in ("cuda", "rocm") and hw.memory_total_bytes:
        cap_memory(device or torch.device("cuda"), max_memory_bytes, hw.memory_total_bytes)
    return hw.model_copy(update={"memory_free_bytes": min(hw.memory_free_bytes, max_memory_bytes)})


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _system_memory() -> tuple[int, int]:
    """(total, available) bytes of RAM from /proc/meminfo, falling back to sysconf."""
    try:
        info = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                info[key] = int(value.split()[0]) * 1024  # kB -> bytes
        return info["MemTotal"], info.get("MemAvailable", info["MemFree"])
    except (OSError, KeyError, ValueError):
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return pages * size, pages * size


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "CPU: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"
