"""One class group's sub-network: prune the teacher for the group, relabel, oversample, retrain.

A sub-network for group ``g`` is a (|g|+1)-way classifier. Label 0 means "not my group"; the group's
classes, in the group's sorted order, become 1..|g|. The negatives outnumber the positives
(|g| = 1 of 10 classes: 9 to 1), so positives are oversampled by ``k*N - P`` extra draws (``N``
negatives, ``P`` positives, ``k`` the wanted positive-to-negative ratio, sensAI's recipe with k = 1).

With ``distill`` = a > 0 the targets are (1 - a) * the one-hot label + a * the teacher's softmax folded
into the (|g|+1) outputs (column 0 gets the teacher's mass on every other class): the distillation
option of the paper, which keeps each sub-network's scores on the teacher's scale so that scores from
different groups compare when merged.

The head starts from the teacher: rows 1..|g| are the teacher's rows of those classes, row 0 the mean
of the other rows, so retraining starts near the teacher's decision and only has to learn "other".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from potluck.classpar.data import ImageSet
from potluck.classpar.errors import PruneError
from potluck.classpar.model import SmallCNN, fit, model_macs, predict
from potluck.classpar.prune import THRESHOLD, apoz, prune, select_channels

logger = logging.getLogger(__name__)


def relabel(y: torch.Tensor, group: Sequence[int]) -> torch.Tensor:
    """(|g|+1)-way labels: 0 for classes outside ``group``, ``1 + position`` for the group's classes."""
    out = torch.zeros_like(y)
    for pos, cls in enumerate(group):
        out[y == cls] = pos + 1
    return out


def oversample_count(positives: int, negatives: int, k: float = 1.0) -> int:
    """Extra positive draws ``k*N - P`` (never negative) that bring positives to ``k`` times negatives."""
    return max(0, math.ceil(k * negatives) - positives)


def training_index(y: torch.Tensor, group: Sequence[int], *, k: float = 1.0, seed: int = 0) -> torch.Tensor:
    """Indices of every sample plus the oversampled positives (each positive drawn once per pass)."""
    positive = torch.isin(y, torch.tensor(list(group), dtype=y.dtype))
    pos_idx = torch.nonzero(positive).flatten()
    if len(pos_idx) == 0:
        raise PruneError(f"group {list(group)} has no training samples")
    extra = oversample_count(len(pos_idx), int((~positive).sum()), k)
    gen = torch.Generator().manual_seed(seed)
    passes = [pos_idx[torch.randperm(len(pos_idx), generator=gen)] for _ in range(-(-extra // len(pos_idx)))]
    drawn = torch.cat(passes)[:extra] if passes else pos_idx[:0]
    return torch.cat([torch.arange(len(y)), drawn])


@torch.no_grad()
def _group_head(teacher: SmallCNN, model: SmallCNN, group: Sequence[int]) -> SmallCNN:
    """``model`` (pruned, teacher's outputs) with a (|g|+1)-way head initialised from the teacher."""
    rows = torch.tensor(list(group), dtype=torch.long)
    others = torch.tensor([c for c in range(teacher.num_outputs) if c not in set(group)], dtype=torch.long)
    head = nn.Linear(model.fc.in_features, len(group) + 1)
    head.weight[1:] = model.fc.weight[rows]
    head.bias[1:] = model.fc.bias[rows]
    if len(others):
        head.weight[0] = model.fc.weight[others].mean(dim=0)
        head.bias[0] = model.fc.bias[others].mean()
    model.fc = head
    return model


@torch.no_grad()
def soft_targets(
    teacher: SmallCNN, x: torch.Tensor, y: torch.Tensor, group: Sequence[int], distill: float
) -> torch.Tensor:
    """(N, |g|+1) target probabilities: one-hot (|g|+1)-way labels mixed with the folded teacher softmax."""
    hard = F.one_hot(relabel(y, group), len(group) + 1).float()
    if distill <= 0.0:
        return hard
    probs = predict(teacher, x)
    inside = probs[:, list(group)]
    folded = torch.cat([(1.0 - inside.sum(dim=1, keepdim=True)).clamp_min(0.0), inside], dim=1)
    return (1.0 - distill) * hard + distill * folded


@dataclass
class Subnet:
    """A trained sub-network, the classes it scores (output ``i+1`` is ``group[i]``) and its cost."""

    model: SmallCNN
    group: list[int]
    macs: int  # multiply-accumulates per image


def build_subnet(
    teacher: SmallCNN,
    data: ImageSet,
    group: Sequence[int],
    *,
    threshold: float = THRESHOLD,
    macs_budget: float | None = None,
    k: float = 1.0,
    distill: float = 0.0,
    epochs: int = 6,
    lr: float = 3e-3,
    seed: int = 0,
) -> Subnet:
    """Prune ``teacher`` by APoZ on ``group``'s images of ``data``, then retrain it on all of ``data``."""
    members = sorted(int(c) for c in group)
    positive = torch.isin(data.y, torch.tensor(members, dtype=data.y.dtype))
    scores = apoz(teacher, data.x[positive])
    keep = select_channels(scores, threshold=threshold, num_outputs=len(members) + 1, macs_budget=macs_budget)
    model = _group_head(teacher, prune(teacher, keep), members)
    index = training_index(data.y, members, k=k, seed=seed)
    torch.manual_seed(seed)
    x, y = data.x[index], data.y[index]
    targets = soft_targets(teacher, x, y, members, distill) if distill > 0.0 else relabel(y, members)
    loss = fit(model, x, targets, epochs=epochs, lr=lr, seed=seed)
    cost = model_macs(model)
    logger.info(
        "subnet %s: widths %s, %d MACs, %d samples, loss %.4f", members, model.widths, cost, len(index), loss
    )
    return Subnet(model, members, cost)
