"""The baseline CNN of a class-parallel job, its penultimate features, cost, and training loop.

Four 3 x 3 convolutions (each conv -> batch norm -> ReLU, a 2 x 2 max-pool after the second and the
fourth), global average pooling, one linear layer. The channel widths are a parameter so that a pruned
sub-network is the same class with smaller widths. The penultimate features are the pooled output of
the last convolution: what class grouping clusters on.

Cost is counted by hand in multiply-accumulates (MACs) per image: convolutions and the linear layer,
the part that scales with widths (batch norm, ReLU and pooling are a few percent and ignored).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

DEFAULT_WIDTHS = (12, 16, 24, 32)
POOL_AFTER = (1, 3)  # indices of the convolutions followed by a 2 x 2 max-pool


class SmallCNN(nn.Module):
    """The 4-conv CNN; ``widths`` are the output channels of the convolutions."""

    def __init__(
        self, widths: Sequence[int] = DEFAULT_WIDTHS, num_outputs: int = 10, in_channels: int = 1
    ) -> None:
        super().__init__()
        self.widths = tuple(int(w) for w in widths)
        self.in_channels = in_channels
        self.convs = nn.ModuleList()
        self.bns = nn.ModuleList()
        prev = in_channels
        for width in self.widths:
            self.convs.append(nn.Conv2d(prev, width, 3, padding=1, bias=False))
            self.bns.append(nn.BatchNorm2d(width))
            prev = width
        self.fc = nn.Linear(prev, num_outputs)

    def activations(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The post-ReLU output of every convolution (before pooling), for APoZ."""
        out: list[torch.Tensor] = []
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns, strict=True)):
            x = F.relu(bn(conv(x)))
            out.append(x)
            if i in POOL_AFTER:
                x = F.max_pool2d(x, 2)
        return out

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features (N, widths[-1]): the globally pooled last convolution."""
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns, strict=True)):
            x = F.relu(bn(conv(x)))
            if i in POOL_AFTER:
                x = F.max_pool2d(x, 2)
        return x.mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))

    @property
    def num_outputs(self) -> int:
        return int(self.fc.out_features)


def macs(widths: Sequence[int], num_outputs: int, side: int = 16, in_channels: int = 1) -> int:
    """Multiply-accumulates of one forward pass of one ``side x side`` image."""
    total = 0
    prev = in_channels
    for i, width in enumerate(widths):
        total += side * side * prev * width * 9
        prev = width
        if i in POOL_AFTER:
            side //= 2
    return total + prev * num_outputs


def model_macs(model: SmallCNN, side: int = 16) -> int:
    """``macs`` of a built model."""
    return macs(model.widths, model.num_outputs, side, model.in_channels)


def fit(
    model: SmallCNN,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    lr: float = 3e-3,
    batch_size: int = 128,
    seed: int = 0,
) -> float:
    """Train with Adam, the learning rate decaying linearly to 0; returns the last epoch's mean loss.

    ``y`` is either class indices (N,) or target probabilities (N, outputs), for distillation.
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    steps = epochs * ((len(y) + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / max(1, steps)))
    model.train()
    last = float("nan")
    for epoch in range(epochs):
        order = torch.randperm(len(y), generator=gen)
        total, count = 0.0, 0
        for start in range(0, len(y), batch_size):
            idx = order[start : start + batch_size]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        last = total / count
        logger.debug("epoch %d: loss %.4f", epoch, last)
    model.eval()
    return last


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """Softmax outputs (N, outputs) in eval mode, float32."""
    model.eval()
    return torch.cat([F.softmax(model(x[i : i + batch_size]), dim=1) for i in range(0, len(x), batch_size)])


@torch.no_grad()
def mean_class_features(model: SmallCNN, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Each class's mean penultimate feature vector (num_classes, widths[-1]), float64."""
    model.eval()
    feats = torch.cat([model.features(x[i : i + 512]) for i in range(0, len(x), 512)]).double()
    out = torch.zeros(num_classes, feats.shape[1], dtype=torch.float64)
    out.index_add_(0, y, feats)
    counts = torch.bincount(y, minlength=num_classes).clamp_min(1).double()
    return out / counts[:, None]
