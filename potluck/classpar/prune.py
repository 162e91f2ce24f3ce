"""Per-group channel pruning by APoZ (average percentage of zeros) on that group's images.

A channel whose ReLU output is (almost) always zero on a group's images carries nothing that group's
sub-network needs. APoZ of a channel is the fraction of its activations, over every image and every
spatial position, with ``|a| <= zero_tol`` (sensAI: 0.005). Channels with APoZ >= ``threshold``
(sensAI: 0.73) are pruned in every convolution.

A threshold alone does not bound the cost, so an optional MACs budget (our addition, for the sizing
target "subnet FLOPs <= 1.5/G of the baseline") keeps pruning the remaining channel with the highest
APoZ until the pruned network fits: the same as lowering the threshold, in every layer at once, just
far enough. (Shrinking the layers evenly instead was tried: no better at G = 10, within run-to-run
noise.) Each layer keeps at least ``min_keep`` channels. The pruned network is a ``SmallCNN`` with
smaller widths whose weights are copied from the kept channels.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

from potluck.classpar.errors import PruneError
from potluck.classpar.model import SmallCNN, macs

logger = logging.getLogger(__name__)

ZERO_TOL = 0.005
THRESHOLD = 0.73  # a fraction, sensAI's default of 73 %


@torch.no_grad()
def apoz(
    model: SmallCNN, x: torch.Tensor, *, zero_tol: float = ZERO_TOL, batch_size: int = 512
) -> list[torch.Tensor]:
    """Per convolution, each channel's fraction of near-zero activations on images ``x`` (float64)."""
    if len(x) == 0:
        raise PruneError("APoZ needs at least one image of the group")
    model.eval()
    zeros = [torch.zeros(w, dtype=torch.float64) for w in model.widths]
    counts = [0] * len(model.widths)
    for start in range(0, len(x), batch_size):
        for i, act in enumerate(model.activations(x[start : start + batch_size])):
            zeros[i] += (act.abs() <= zero_tol).sum(dim=(0, 2, 3)).double()
            counts[i] += act.shape[0] * act.shape[2] * act.shape[3]
    return [z / c for z, c in zip(zeros, counts, strict=True)]


def select_channels(
    scores: Sequence[torch.Tensor],
    *,
    threshold: float = THRESHOLD,
    num_outputs: int,
    macs_budget: float | None = None,
    min_keep_fraction: float = 0.1,
    side: int = 16,
    in_channels: int = 1,
) -> list[list[int]]:
    """The channels to keep in each convolution (sorted indices), from APoZ ``scores``.

    ``macs_budget`` is in multiply-accumulates per image of the pruned network with ``num_outputs``.
    """
    if not 0.0 < threshold <= 1.0:
        raise PruneError(f"the APoZ threshold is a fraction in (0, 1], got {threshold}")
    keep = [[c for c in range(len(s)) if float(s[c]) < threshold] for s in scores]
    floors = [max(2, math.ceil(min_keep_fraction * len(s))) for s in scores]
    for layer, s in enumerate(scores):  # refill a layer the threshold emptied, lowest APoZ first
        if len(keep[layer]) < floors[layer]:
            keep[layer] = sorted(sorted(range(len(s)), key=lambda c: (float(s[c]), c))[: floors[layer]])

    def cost() -> int:
        return macs([len(k) for k in keep], num_outputs, side, in_channels)

    while macs_budget is not None and cost() > macs_budget:
        candidates = [
            (float(scores[layer][c]), layer, c)
            for layer in range(len(keep))
            if len(keep[layer]) > floors[layer]
            for c in keep[layer]
        ]
        if not candidates:
            raise PruneError(f"cannot meet a budget of {macs_budget:.0f} MACs: every layer is at its floor")
        _, layer, c = max(candidates)  # highest APoZ; ties go to the later layer and channel
        keep[layer].remove(c)
    logger.debug("keeping widths %s (%d MACs)", [len(k) for k in keep], cost())
    return keep


@torch.no_grad()
def prune(model: SmallCNN, keep: Sequence[Sequence[int]]) -> SmallCNN:
    """A copy of ``model`` with only the ``keep`` channels of each convolution (same outputs)."""
    if len(keep) != len(model.widths) or any(len(k) == 0 for k in keep):
        raise PruneError(f"need a non-empty channel list for each of {len(model.widths)} convolutions")
    out = SmallCNN([len(k) for k in keep], model.num_outputs, model.in_channels)
    prev: torch.Tensor = torch.arange(model.in_channels)
    layers = zip(model.convs, model.bns, out.convs, out.bns, keep, strict=True)
    for src_conv, src, dst_conv, dst, channels in layers:
        idx = torch.tensor(list(channels), dtype=torch.long)
        dst_conv.get_parameter("weight").copy_(src_conv.get_parameter("weight")[idx][:, prev])
        for name in ("weight", "bias", "running_mean", "running_var"):
            getattr(dst, name).copy_(getattr(src, name)[idx])
        prev = idx
    out.fc.weight.copy_(model.fc.weight[:, prev])
    out.fc.bias.copy_(model.fc.bias)
    return out
