"""DiLoCo-style local steps: H inner optimizer steps, then one outer step on the averaged pseudo-gradient.

Effect on the update: replicas drift apart for H inner steps; at each sync they all-reduce the
pseudo-gradient (snapshot - current parameters: how far each moved since the last sync), reset to the
snapshot, and apply one outer Nesterov-momentum SGD step with that mean. With H = 1, outer lr 1 and no
momentum this is plain synchronous data parallelism on the inner optimizer's updates. Communication
drops H-fold, and the pseudo-gradient (not raw gradients) is what gets compressed, which the research
notes found to be where aggressive codecs hurt least.

The all-reduce is injected (``allreduce(flat_tensor) -> mean``), so this runs on the tree executor, a
relaxed round, or an in-process reference with the same code.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import torch

from potluck.peer.config import DiLoCoConfig

AllReduce = Callable[[torch.Tensor], Awaitable[torch.Tensor]]


class DiLoCo:
    """Wraps a model's parameters; call ``after_inner_step`` after every inner optimizer step."""

    def __init__(self, params: Iterable[torch.nn.Parameter], cfg: DiLoCoConfig) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.cfg = cfg
        self.snapshot = [p.detach().clone() for p in self.params]  # parameters at the last sync
        self.outer = torch.optim.SGD(
            self.snapshot, lr=cfg.outer_lr, momentum=cfg.outer_momentum, nesterov=cfg.outer_momentum > 0
        )
        self.inner_done = 0
        self.syncs = 0

    async def after_inner_step(self, allreduce: AllReduce) -> bool:
        """Count an inner step; every ``inner_steps`` of them, sync. Returns whether it synced."""
        self.inner_done += 1
        if self.inner_done % self.cfg.inner_steps:
            return False
        await self.sync(allreduce)
        return True

    async def sync(self, allreduce: AllReduce) -> None:
        with torch.no_grad():
            pseudo = torch.cat(
                [(s - p.detach()).reshape(-1) for s, p in zip(self.snapshot, self.params, strict=True)]
            ).cpu()  # the all-reduce codes and sends host tensors (a no-op on a CPU stage)
        mean = await allreduce(pseudo)
        with torch.no_grad():
            offset = 0
            for s in self.snapshot:
                n = s.numel()
                s.grad = mean[offset : offset + n].view_as(s).to(s.device, s.dtype).clone()
                offset += n
            self.outer.step()  # snapshot <- snapshot - outer_lr * nesterov(mean pseudo-gradient)
            self.outer.zero_grad(set_to_none=True)
            for s, p in zip(self.snapshot, self.params, strict=True):
                p.copy_(s)  # every replica restarts its inner steps from the same point
        self.syncs += 1
