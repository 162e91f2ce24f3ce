"""Host staging for the wire: tensors leaving and entering a GPU stage through reusable pinned buffers.

Codecs and the network work on host memory. A CUDA stage's outgoing activations and gradients are
copied device -> host into a pinned buffer from a pool, on a side stream that first waits for the
compute stream (so the copy starts once the tensor is written, and the next micro-batch's compute is
not held up behind it); an event marks the copy's end, and the sender waits for that event off the
compute thread before encoding. Incoming tensors are decoded into a pooled pinned buffer and copied
host -> device with ``non_blocking=True``; the buffer goes back to the pool with an event and is handed
out again only once that copy has finished.

On the CPU (``pooled=False``, the default off CUDA) every call is a passthrough: ``to_host`` returns
the tensor itself (contiguous), ``to_device`` returns its argument, nothing is pooled or pinned, so a
CPU peer computes exactly what it did before staging existed. ``pooled=True`` on the CPU runs the pool
code with plain synchronous copies (tests use it to exercise the GPU path's buffer handling).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

logger = logging.getLogger(__name__)

MAX_FREE_PER_SHAPE = 8  # free buffers kept per (elements, dtype); more are dropped when given back


def try_pin(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``t`` in page-locked memory when this build and machine allow it, else ``t`` itself; and
    whether it is pinned (``pin_memory`` raises without a CUDA driver on some builds)."""
    try:
        return t.pin_memory(), True
    except (RuntimeError, NotImplementedError) as e:
        logger.debug("pinned host memory unavailable (%s): pageable buffers", e)
        return t, False


class HostPool:
    """Reusable host buffers keyed by (elements, dtype); pinned when ``pin`` and possible."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self._lock = threading.Lock()  # taken from compute and autograd threads, given back from others
        self._free: dict[tuple[int, torch.dtype], list[tuple[torch.Tensor, torch.cuda.Event | None]]] = {}
        self.allocated = 0  # buffers created over the pool's life (reuse keeps this flat)
        self.pinned = 0  # of which page-locked

    def take(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """A buffer of ``shape`` and ``dtype`` whose last use (if any) has finished."""
        shape = tuple(int(d) for d in shape)
        with self._lock:
            free = self._free.get((math.prod(shape), dtype), [])
            for i, (buf, done) in enumerate(free):
                if done is None or done.query():
                    free.pop(i)
                    return buf.view(shape)
            self.allocated += 1
            pin = self.pin
        buf = torch.empty(math.prod(shape), dtype=dtype)
        if pin:
            buf, pinned = try_pin(buf)
            with self._lock:
                self.pinned += pinned
                self.pin = self.pin and pinned  # once refused, stop asking
        return buf.view(shape)

    def give(self, buf: torch.Tensor, done: torch.cuda.Event | None = None) -> None:
        """Return ``buf``; ``done``: an event after the last copy out of it (None: free now)."""
        with self._lock:
            free = self._free.setdefault((buf.numel(), buf.dtype), [])
            if len(free) < MAX_FREE_PER_SHAPE:
                free.append((buf.reshape(-1), done))

    @property
    def free(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._free.values())


@dataclass
class Outgoing:
    """A tensor on its way to the host: ``wait()`` blocks until it is there (call it off the compute
    thread and off the event loop), ``release()`` returns its buffer once it has been encoded."""

    tensor: torch.Tensor
    done: torch.cuda.Event | None = None
    _release: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def pending(self) -> bool:
        return self.done is not None

    def wait(self) -> torch.Tensor:
        if self.done is not None:
            self.done.synchronize()
        return self.tensor

    def release(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None


class Staging:
    """One stage's host staging: a side stream (CUDA) and a pool of host buffers."""

    def __init__(self, device: torch.device, pooled: bool | None = None) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.pooled = self.cuda if pooled is None else pooled
        self.pool = HostPool(pin=self.cuda)
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._lent: set[int] = set()  # data pointers of host_buffer()s not yet returned by to_device

    def to_host(self, t: torch.Tensor) -> Outgoing:
        """Start moving ``t`` to the host; call from the thread that produced it, right after."""
        t = t.detach()
        if not self.pooled:
            return Outgoing(t.contiguous() if t.device.type == "cpu" else t.cpu().contiguous())
        buf = self.pool.take(t.shape, t.dtype)
        if self.stream is None or t.device.type != "cuda":
            buf.copy_(t)
            return Outgoing(buf, None, lambda: self.pool.give(buf))
        self.stream.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(self.stream):
            buf.copy_(t, non_blocking=True)
            done = torch.cuda.Event(blocking=True)  # the waiting thread sleeps instead of spinning
            done.record(self.stream)
        t.record_stream(self.stream)  # the caching allocator keeps t's memory until the copy is done
        return Outgoing(buf, done, lambda: self.pool.give(buf))

    def host_buffer(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A (pinned, pooled) host buffer to decode an incoming tensor into; ``to_device`` returns it."""
        if not self.pooled:
            return torch.empty(shape, dtype=dtype)
        buf = self.pool.take(shape, dtype)
        self._lent.add(buf.data_ptr())
        return buf

    def to_device(self, host: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``host`` on the stage's device (asynchronously from a pinned buffer, ordered on the calling
        thread's current stream). A buffer from ``host_buffer`` goes back to the pool once the copy has
        finished; any other tensor is left alone."""
        lent = self.pooled and host.data_ptr() in self._lent
        if host.device == self.device:
            out = host if dtype is None or dtype == host.dtype else host.to(dtype)
            if lent:  # the buffer is handed out again for the next message: give the caller a copy
                out = host.clone() if out is host else out
                self._give(host, None)
            return out
        out = host.to(self.device, dtype=dtype, non_blocking=host.is_pinned())
        if lent:
            done = None
            if self.cuda:
                done = torch.cuda.Event()
                done.record(torch.cuda.current_stream(self.device))
            self._give(host, done)
        return out

    def _give(self, host: torch.Tensor, done: torch.cuda.Event | None) -> None:
        self._lent.discard(host.data_ptr())
        self.pool.give(host, done)
