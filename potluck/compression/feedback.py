"""Error feedback as caller-owned state: the part of the signal a codec dropped is added back next time.

    x_t      = g_t + decay * e_{t-1}
    payload  = encode(x_t)
    e_t      = x_t - decode(payload)

``decay`` (default 1: nothing forgotten) below 1 makes the residual a leaky accumulator of everything
not sent yet; on DiLoCo pseudo-gradients it then plays the part of the outer optimizer's momentum
(``peer.collectives.diloco.OuterCodec``).

The state is never global: the caller keeps one ``ErrorFeedback`` per (tensor, destination) and passes
it as ``state=``. It also holds per-codec extras (e.g. PowerSGD's warm-start factor).
"""

from __future__ import annotations

from typing import Any

import torch

from potluck.compression.errors import EncodeError


class ErrorFeedback:
    """Residual of previous encodes (fp32 by default; bf16 halves its memory at some precision cost)."""

    def __init__(self, dtype: torch.dtype = torch.float32, enabled: bool = True, decay: float = 1.0) -> None:
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise EncodeError(f"error-feedback residual dtype must be fp32/bf16/fp16, not {dtype}")
        if not 0.0 <= decay <= 1.0:
            raise EncodeError(f"error-feedback decay must be in [0, 1], not {decay}")
        self.dtype = dtype
        self.decay = float(decay)
        self.enabled = enabled
        self.residual: torch.Tensor | None = None
        self._spare: torch.Tensor | None = None  # the previous residual's buffer, reused next time
        self.extras: dict[str, Any] = {}
        self.steps = 0

    def reset(self) -> None:
        self.residual = None
        self._spare = None
        self.extras.clear()
        self.steps = 0

    def checked_residual(self, flat: torch.Tensor) -> torch.Tensor | None:
        """The residual to add to ``flat`` (None on the first call), already multiplied by ``decay`` (in
        place: call it once per encode); refuses a mismatched one."""
        if not self.enabled or self.residual is None:
            return None
        if self.residual.numel() != flat.numel() or self.residual.device != flat.device:
            raise EncodeError(
                f"error-feedback state holds {self.residual.numel()} elements on {self.residual.device}, "
                f"tensor has {flat.numel()} on {flat.device}: use one state per tensor (or reset() it)"
            )
        if self.decay != 1.0:
            self.residual.mul_(self.decay)
        return self.residual

    def apply(self, flat: torch.Tensor) -> torch.Tensor:
        """g + e as a fresh fp32 vector (e is zero on the first call)."""
        x = flat.to(torch.float32, copy=True)
        e = self.checked_residual(flat)
        return x if e is None else x.add_(e)

    def spare_buffer(self, flat: torch.Tensor) -> torch.Tensor | None:
        """An fp32 buffer of flat's size, not aliasing the residual, for the next residual (fused path)."""
        if self.dtype != torch.float32 or not self.enabled:
            return None
        sp = self._spare
        if sp is None or sp.numel() != flat.numel() or sp.device != flat.device:
            sp = self._spare = torch.empty(flat.numel(), dtype=torch.float32, device=flat.device)
        return sp

    def store(self, residual: torch.Tensor) -> None:
        if self.enabled:
            old = self.residual
            self.residual = residual if residual.dtype == self.dtype else residual.to(self.dtype)
            if residual is self._spare:  # swap: the old residual's memory becomes the next spare
                self._spare = old if old is not None and old.dtype == torch.float32 else None
            self.steps += 1

    def norm(self) -> float:
        return 0.0 if self.residual is None else float(self.residual.float().norm())
