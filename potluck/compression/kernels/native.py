"""Builds, caches and calls the native CPU codec kernels (native_codec.c) through ctypes.

The C file is compiled once per machine with the system C compiler (``cc``, or ``$CC``) into
``$POTLUCK_KERNEL_CACHE`` (default ``~/.cache/potluck/kernels``), keyed by the source, the flags, the
compiler and the CPU, so a home directory shared by different machines keeps one build per CPU. The
build is written to a temporary name and renamed, so peers starting together never load half a file.
Without a compiler (or with ``POTLUCK_CODEC_BACKEND`` set to ``eager``/``compile``) ``lib()`` returns
None and callers use the torch path, which gives the same bits, slower. Images without a compiler ship a
build made for a baseline CPU (``python -m potluck.compression.kernels.native --portable --out PATH``)
and point ``POTLUCK_KERNEL_LIB`` at it.

Calls release the GIL (ctypes does), so ``parallel`` splits a tensor's blocks across a small thread
pool: the 2-core CI box gets both cores without OpenMP, whose runtime does not survive ``fork``.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native_codec.c")
ABI = 1
# -ffp-contract=off: no FMA, so products round as in torch; no -ffast-math: IEEE division and no
# flush-to-zero. -march=native is only about speed: the operations are exact, so bits do not change.
FLAGS = ["-O3", "-std=c11", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-Wno-psabi"]
# --portable: the oldest CPUs with the CRC32C instruction (x86-64-v2 has SSE4.2; ARMv8 its CRC extension)
PORTABLE = {"x86_64": "-march=x86-64-v2", "amd64": "-march=x86-64-v2", "aarch64": "-march=armv8-a+crc"}
BUILD_TIMEOUT_S = 120.0
# Below this many elements a tensor is not split across threads: a pool hand-off costs ~30 us.
PARALLEL_MIN_ELEMENTS = 1 << 18

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False
_pool: ThreadPoolExecutor | None = None
T = TypeVar("T")

# argument and result types, one letter each: p pointer, i int, I uint32, q int64, Q uint64, s char*
_CTYPES = {
    "p": ctypes.c_void_p,
    "i": ctypes.c_int,
    "I": ctypes.c_uint32,
    "q": ctypes.c_int64,
    "Q": ctypes.c_uint64,
    "s": ctypes.c_char_p,
}
_SIGNATURES = {  # name: (result, arguments), as in native_codec.c
    "plk_abi": ("i", ""),
    "plk_crc_impl": ("s", ""),
    "plk_crc32c": ("I", "IpQ"),
    "plk_crc32c_combine": ("I", "IIQ"),
    "plk_quantize": ("i", "pppqqqiiiIIqippp"),
    "plk_dequantize": ("i", "ppqqqiipi"),
}


def cache_dir() -> Path:
    env = os.environ.get("POTLUCK_KERNEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "potluck" / "kernels"


def _cpu_tag() -> str:
    """What the build depends on besides the source: CPU model and feature flags (-march=native)."""
    tag = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags", "Features")):
                tag += line
                if line.startswith(("flags", "Features")):
                    break
    except OSError:
        tag += platform.processor()
    return tag


def _compile(cc: str, out: Path, march: str | None) -> bool:
    flags = [*FLAGS, march] if march else FLAGS
    with tempfile.NamedTemporaryFile(dir=out.parent, prefix=out.name, suffix=".tmp", delete=False) as f:
        tmp = Path(f.name)
    try:
        proc = subprocess.run(
            [cc, *flags, "-o", str(tmp), str(SOURCE), "-lm"],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        if proc.returncode != 0:
            logger.info("native codec build with %s failed: %s", flags, proc.stderr.strip()[-800:])
            return False
        tmp.chmod(0o755)  # readable by every user: an image builds it as root and runs as another
        os.replace(tmp, out)
        return True
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.info("native codec build failed: %s", exc)
        return False
    finally:
        tmp.unlink(missing_ok=True)


def build(force: bool = False, portable: bool = False, out: Path | None = None) -> Path | None:
    """Path of the compiled library, building it if needed; None without a working compiler.
    ``portable`` builds for the baseline CPU of this architecture instead of this machine's."""
    cc = os.environ.get("CC", "cc")
    march = PORTABLE.get(platform.machine().lower()) if portable else "-march=native"
    tag = "portable" if portable else _cpu_tag()
    key = hashlib.sha256(
        SOURCE.read_bytes() + " ".join([cc, *FLAGS, str(march)]).encode() + tag.encode()
    ).hexdigest()[:20]
    out = out or cache_dir() / f"plk_codec_{ABI}_{key}.so"
    if out.exists() and not force:
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        logger.warning("cannot create the kernel cache %s (%s); native codecs off", out.parent, exc)
        return None
    if _compile(cc, out, march) or _compile(cc, out, None):
        return out
    return None


def load(path: Path) -> ctypes.CDLL | None:
    """Load a built library and check its ABI and a known CRC32C answer; None if either is wrong."""
    lib = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = _CTYPES[restype]
        fn.argtypes = [_CTYPES[c] for c in argtypes]
    if lib.plk_abi() != ABI:
        logger.warning("native codec library %s has ABI %d, expected %d", path, lib.plk_abi(), ABI)
        return None
    # a known answer before first use: CRC32C("123456789") is 0xE3069283
    probe = b"123456789"
    if lib.plk_crc32c(0, probe, len(probe)) != 0xE3069283:
        logger.warning("native codec library %s computes a wrong CRC32C; not used", path)
        return None
    return lib


def lib() -> ctypes.CDLL | None:
    """The loaded library, or None when native kernels are off or cannot be built (logged once)."""
    global _lib, _tried
    if os.environ.get("POTLUCK_CODEC_BACKEND", "auto") not in ("auto", "native"):
        return None
    if _tried:
        return _lib
    with _lock:
        if not _tried:
            try:
                given = os.environ.get("POTLUCK_KERNEL_LIB")
                path = Path(given) if given else build()
                _lib = load(path) if path is not None else None
            except OSError as exc:
                logger.warning("native codec library failed to load (%s)", exc)
                _lib = None
            if _lib is None:
                logger.warning("native codec kernels unavailable (no C compiler?); using the torch path")
            _tried = True
    return _lib


def _reset_after_fork() -> None:
    global _pool
    _pool = None  # the parent's worker threads do not exist in the child


os.register_at_fork(after_in_child=_reset_after_fork)


def threads_for(n: int) -> int:
    if n < PARALLEL_MIN_ELEMENTS:
        return 1
    return max(1, min(torch.get_num_threads(), 8, n // PARALLEL_MIN_ELEMENTS))


def parallel(nblocks: int, parts: int, fn: Callable[[int, int], T]) -> list[T]:
    """fn(b0, b1) over ``parts`` contiguous block ranges, in order; the caller's thread runs the first."""
    global _pool
    if parts <= 1 or nblocks < 2:
        return [fn(0, nblocks)]
    parts = min(parts, nblocks)
    edges = [nblocks * i // parts for i in range(parts + 1)]
    if _pool is None:
        with _lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max_workers=7, thread_name_prefix="potluck-codec")
    futures = [_pool.submit(fn, edges[i], edges[i + 1]) for i in range(1, parts)]
    first = fn(edges[0], edges[1])
    return [first, *(f.result() for f in futures)]
