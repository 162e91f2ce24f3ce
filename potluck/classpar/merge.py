"""Merging sub-network outputs into one score per class, in class order.

Each sub-network returns a softmax over its |g|+1 outputs. Column 0 ("not my group") is dropped, the
remaining |g| columns of every group are concatenated in group order, and the concatenation is
permuted back to class order: class ``groups[i][j]`` takes column ``1 + j`` of group ``i``. The class
with the highest merged score is the prediction. A serving peer sends only its |g| floats (float32,
4 bytes each), so a query costs exactly 4 * K bytes of replies.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from potluck.classpar.errors import MergeError
from potluck.classpar.grouping import Groups, class_order
from potluck.classpar.model import predict
from potluck.classpar.subnet import Subnet

logger = logging.getLogger(__name__)


def group_scores(subnet: Subnet, x: torch.Tensor) -> torch.Tensor:
    """What a serving peer returns for images ``x``: (N, |g|) float32 softmax scores, column 0 dropped."""
    return predict(subnet.model, x)[:, 1:].contiguous()


def merge_scores(scores: Sequence[torch.Tensor], groups: Groups) -> torch.Tensor:
    """(N, K) scores in class order from each group's (N, |g|) scores (column 0 already dropped)."""
    if len(scores) != len(groups):
        raise MergeError(f"{len(scores)} score blocks for {len(groups)} groups")
    for block, group in zip(scores, groups, strict=True):
        if block.dim() != 2 or block.shape[1] != len(group):
            raise MergeError(f"group {group} needs (N, {len(group)}) scores, got {tuple(block.shape)}")
    order = torch.tensor(class_order(groups), dtype=torch.long)
    cat = torch.cat(list(scores), dim=1)
    out = torch.empty_like(cat)
    out[:, order] = cat  # column j of the concatenation belongs to class order[j]
    return out


def merge_outputs(outputs: Sequence[torch.Tensor], groups: Groups) -> torch.Tensor:
    """(N, K) scores from each group's full (N, |g|+1) softmax: drop column 0, then ``merge_scores``."""
    return merge_scores([o[:, 1:] for o in outputs], groups)


def grouped_scores(subnets: Sequence[Subnet], x: torch.Tensor) -> torch.Tensor:
    """Every sub-network on ``x``, merged: (N, K) float32."""
    return merge_scores([group_scores(s, x) for s in subnets], [s.group for s in subnets])


def accuracy(scores: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of rows whose highest score is the label."""
    return float((scores.argmax(dim=1) == y).double().mean())
