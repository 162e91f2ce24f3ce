"""Where a stage computes and in what precision: device names, bf16 autocast, GPU memory caps.

``--device`` takes ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``. ``auto`` picks CUDA (or ROCm,
which torch also calls "cuda") when a device is visible, then Apple MPS, else the CPU; a named device
that is not there is refused with an error that says why, never silently replaced by the CPU.

Precision (``--precision``): ``auto`` runs the stage's forward and backward under bf16 autocast on
CUDA and in plain fp32 elsewhere; ``bf16`` asks for autocast on any device (the CPU too: tests run the
CUDA code path there); ``fp32`` turns it off. Autocast casts the inputs of matmuls to bf16 and keeps
reductions, norms and the loss in fp32; the parameters (master weights), their gradients and the AdamW
state stay fp32, so no loss scaling is needed (bf16 has fp32's exponent range).

A memory cap (``--max-memory``) becomes the caching allocator's share of the card
(``torch.cuda.set_per_process_memory_fraction``): ``memory_fraction`` is the pure arithmetic.
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Literal

import torch

from potluck.model.errors import DeviceError

logger = logging.getLogger(__name__)

Precision = Literal["auto", "bf16", "fp32"]
PRECISIONS: tuple[str, ...] = ("auto", "bf16", "fp32")
_DEVICE = re.compile(r"(auto|cpu|mps|cuda)(?::(\d+))?")


def parse_device(text: str) -> tuple[str, int | None]:
    """Syntax only (no torch query): ``"cuda:1"`` -> ("cuda", 1), ``"auto"`` -> ("auto", None)."""
    m = _DEVICE.fullmatch(text.strip().lower())
    if m is None or (m.group(2) is not None and m.group(1) != "cuda"):
        raise DeviceError(f"--device {text!r}: use auto, cpu, cuda, cuda:N or mps")
    return m.group(1), None if m.group(2) is None else int(m.group(2))


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and bool(mps.is_available())


def resolve_device(text: str = "auto") -> torch.device:
    """The torch device ``--device text`` names, checked to exist; ``DeviceError`` says why not."""
    kind, index = parse_device(text)
    if kind == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "mps":
        if not _mps_available():
            raise DeviceError("--device mps: Apple's Metal backend is not available in this torch build")
        return torch.device("mps")
    if not torch.cuda.is_available():
        built = torch.version.cuda or getattr(torch.version, "hip", None)
        why = f"torch {torch.__version__} was built without CUDA" if not built else "no GPU is visible"
        raise DeviceError(f"--device {text}: {why} (try --device cpu, or check nvidia-smi)")
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        raise DeviceError(f"--device {text}: this machine has {count} CUDA device(s): cuda:0..{count - 1}")
    return torch.device("cuda", torch.cuda.current_device() if index is None else index)


def use_device(device: torch.device) -> None:
    """Make ``device`` the current CUDA device of this thread (a no-op elsewhere): streams and
    allocations that name no index then land on the stage's card."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """The autocast dtype of a stage on ``device`` (None: plain fp32)."""
    if precision not in PRECISIONS:
        raise DeviceError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if precision == "fp32" or (precision == "auto" and device.type != "cuda"):
        return None
    return torch.bfloat16


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast for ``device``'s type, or nothing when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def memory_fraction(cap_bytes: int, total_bytes: int) -> float:
    """The share of a card of ``total_bytes`` that ``cap_bytes`` is, in (0, 1]."""
    if cap_bytes <= 0 or total_bytes <= 0:
        raise DeviceError(f"memory cap {cap_bytes} of {total_bytes} bytes: both must be positive")
    return min(1.0, cap_bytes / total_bytes)


def cap_memory(device: torch.device, cap_bytes: int, total_bytes: int) -> float | None:
    """Cap the CUDA caching allocator on ``device`` at ``cap_bytes`` (an allocation beyond it raises
    out-of-memory in this process instead of taking the card); returns the fraction set, None off CUDA
    (CPU memory is not capped: the cap only tells the planner what this peer offers)."""
    if device.type != "cuda" or not total_bytes:
        return None
    fraction = memory_fraction(cap_bytes, total_bytes)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    logger.info("CUDA allocator on %s capped at %.3f of %d bytes", device, fraction, total_bytes)
    return fraction
