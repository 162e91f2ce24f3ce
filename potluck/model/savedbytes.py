"""Accounting of the activation memory autograd keeps for backward, as it is saved and freed.

``SavedBytes.hooks()`` installs ``torch.autograd.graph.saved_tensors_hooks`` for the calling thread
(torch keeps these hooks per thread, so two waves on two threads count separately). Every tensor the
forward saves is wrapped in a small holder; autograd frees its saved tensors once their node's backward
has run, the holder's last reference goes, and its bytes leave the count. A storage saved by several
ops (a layer input read by two of them, views of one buffer) counts once; parameters never count.

This is what "memory" means for tick-tock on a CPU, where no allocator can be capped: the budget is
enforced on these accounted bytes (``peer/train/ticktock.py``). On a GPU they are the part of the
allocator's use that moves within a step, the rest (weights, gradients, optimizer state) being fixed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

import torch

Listener = Callable[[int], None]  # called with the change in bytes (+ saved, - freed), any thread


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    """(data pointer, bytes) of the storage under ``t``; (0, 0) for tensors without one."""
    try:
        st = t.untyped_storage()
        return st.data_ptr(), st.nbytes()
    except (RuntimeError, NotImplementedError):  # sparse, meta or wrapper subclasses
        return 0, 0


class _Held:
    """What autograd stores in place of a saved tensor; frees its bytes when autograd lets it go."""

    __slots__ = ("counter", "key", "tensor")

    def __init__(self, counter: SavedBytes, tensor: torch.Tensor, key: int) -> None:
        self.counter, self.tensor, self.key = counter, tensor, key

    def __del__(self) -> None:
        if self.key:
            self.counter._release(self.key)


class SavedBytes:
    """Live and peak bytes of saved activations in one thread's forwards; ``events`` is the trace of
    (seconds since ``start_clock``, live bytes after the change), kept when ``trace`` is set."""

    def __init__(
        self, exclude: Iterable[torch.Tensor] = (), listener: Listener | None = None, trace: bool = True
    ) -> None:
        self._exclude = {_storage_key(p)[0] for p in exclude}
        self._exclude.discard(0)
        self._refs: dict[int, tuple[int, int]] = {}  # storage pointer -> (holders, bytes)
        self._lock = threading.Lock()
        self._listener = listener
        self._trace = trace
        self._t0 = time.perf_counter()
        self.live = 0
        self.peak = 0
        self.events: list[tuple[float, int]] = []

    def start_clock(self, t0: float) -> None:
        """Times in ``events`` count from ``t0`` (a ``time.perf_counter()`` reading)."""
        self._t0 = t0

    def hooks(self) -> AbstractContextManager[None]:
        """Count what forwards run inside this context save (this thread only)."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor) -> object:
        ptr, nbytes = _storage_key(t)
        if not ptr or ptr in self._exclude:
            return _Held(self, t, 0)
        with self._lock:
            holders, size = self._refs.get(ptr, (0, nbytes))
            self._refs[ptr] = (holders + 1, size)
            added = size if holders == 0 else 0
            if added:
                self._changed(added)
        return _Held(self, t, ptr)

    @staticmethod
    def _unpack(held: object) -> torch.Tensor:
        assert isinstance(held, _Held)
        return held.tensor

    def _release(self, ptr: int) -> None:
        with self._lock:
            holders, size = self._refs[ptr]
            if holders > 1:
                self._refs[ptr] = (holders - 1, size)
                return
            del self._refs[ptr]
            self._changed(-size)

    def _changed(self, delta: int) -> None:
        # under self._lock
        self.live += delta
        self.peak = max(self.peak, self.live)
        if self._trace:
            self.events.append((time.perf_counter() - self._t0, self.live))
        if self._listener is not None:
            self._listener(delta)
