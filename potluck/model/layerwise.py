"""A micro-batch's forward and backward as a sequence of per-layer ops that a scheduler can interleave.

``Layerwise.ops`` is a generator: it yields the next op (``forward i`` or ``backward i``) *before*
running it, so the caller can time each op, read the activation memory between ops, or hold a forward
back until memory frees (the tick-tock executor does all three). Layers are joined at detached
boundaries (each layer's input is a fresh leaf), the way pipeline stages are joined: the values and
gradients are those of one autograd graph over the whole model (tested against ``StageRunner``).

The last layer's output goes through ``loss``; the op returns nothing, the mean loss is kept in
``last_loss`` and its backward runs on ``loss * weight`` (``weight``: the micro-batch's share of the
batch the gradient averages over, as in ``model/stage.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch

from potluck.model.device import autocast, autocast_dtype
from potluck.model.transformer import StageModel

logger = logging.getLogger(__name__)

Layer = Callable[[torch.Tensor], torch.Tensor]
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Op(NamedTuple):
    kind: str  # "forward" | "backward"
    layer: int


class Layerwise:
    """``layers`` run in order; ``loss(output, targets)`` ends the last one (None: the output is a
    scalar already)."""

    def __init__(self, layers: Sequence[Layer], loss: Loss | None = None) -> None:
        if not layers:
            raise ValueError("a layerwise model needs at least one layer")
        self.layers = list(layers)
        self.loss = loss
        self.last_loss: torch.Tensor | None = None
        # the running micro-batch's token ids (its inputs, when they are ids): layers that re-embed
        # them at a bottleneck (model.bottleneck_tokens) read them here
        self.tokens: torch.Tensor | None = None

    def ops(self, inputs: torch.Tensor, targets: torch.Tensor | None, weight: float) -> Iterator[Op]:
        """Yield each op before running it; after the last, parameter gradients hold this micro-batch's
        weighted contribution (added to what they held)."""
        n = len(self.layers)
        ins: list[torch.Tensor | None] = []
        outs: list[torch.Tensor | None] = []
        x = inputs
        self.tokens = None if inputs.is_floating_point() else inputs
        for i, layer in enumerate(self.layers):
            yield Op("forward", i)
            if i > 0 or x.is_floating_point():
                x = x.detach().requires_grad_(i > 0)
            out = layer(x)
            if i == n - 1:
                if self.loss is not None:
                    if targets is None:
                        raise ValueError("the loss needs targets")
                    out = self.loss(out, targets)
                self.last_loss = out.detach()
                out = out * weight
            ins.append(x)
            outs.append(out)
            x = out
        grad: torch.Tensor | None = None
        for i in reversed(range(n)):
            yield Op("backward", i)
            node_out, node_in = outs[i], ins[i]
            assert node_out is not None and node_in is not None
            node_out.backward(grad)
            grad = node_in.grad if i > 0 else None
            outs[i] = ins[i] = None  # the graph and its saved tensors go now, not at the end
            del node_out, node_in

    def run(self, inputs: torch.Tensor, targets: torch.Tensor | None = None, weight: float = 1.0) -> float:
        """One micro-batch, start to end; returns its unweighted loss."""
        for _ in self.ops(inputs, targets, weight):
            pass
        assert self.last_loss is not None
        return float(self.last_loss)


def stage_layers(model: StageModel, device: torch.device | None = None, precision: str = "fp32") -> Layerwise:
    """A whole or partial transformer stage as layers: the embedding with the first block, each block,
    the final norm and head with the last block; the loss is ``StageModel.loss`` on the last stage."""
    dev = device if device is not None else next(model.parameters()).device
    dtype = autocast_dtype(dev, precision)
    blocks = list(model.layers)

    def block(k: int) -> Layer:
        def run(x: torch.Tensor) -> torch.Tensor:
            with autocast(dev, dtype):
                if k == 0:
                    x = model.enter(x, lw.tokens)  # embedding, or received codes up-projected
                h = model.after_layer(k, blocks[k](x, model.cos, model.sin), lw.tokens)  # and its bottleneck
                if k == len(blocks) - 1 and model.norm is not None and model.head is not None:
                    h = model.head(model.norm(h))
                return h

        return run

    lw = Layerwise([block(k) for k in range(len(blocks))], StageModel.loss if model.is_last else None)
    return lw
