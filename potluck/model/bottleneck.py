"""A learned low-rank bottleneck at stage boundaries: fewer activation bytes before any codec.

With ``model.bottleneck_rank = r`` (``ModelSpec``), the boundary after layer k - 1 (a cut between
stages) carries r numbers per token instead of d_model. The stage ending at k applies the
down-projection ``D`` (r x d) to its output and sends the codes ``c = x D^T``; the stage starting at k
applies the up-projection ``U`` (d x r) to what it receives, ``x' = c U^T``. Activation gradients
travel back r-dimensional too (``dL/dc = dL/dx' U``), so both directions shrink by d / r before the
job's activation codec (quantization, delta coding, zstd) takes its own share.

Initialisation: ``D`` holds the first r rows of the identity and ``U = D^T``. The round trip is then
exact on the kept subspace (``D U = I_r``), and with r = d the model equals the model without a
bottleneck, forward and backward (tested). At init the residual stream is isotropic (normal embeddings
and weights), so keeping the first r coordinates loses nothing a random orthonormal basis would keep;
training moves both maps to the subspace the loss needs.

``D`` and ``U`` are ordinary parameters of the stages that hold them: stepped by their AdamW, summed
among replicas with the other gradients, checkpointed and resumed with the stage. Their names are
global and stable, ``boundaries.<k>.down.weight`` and ``boundaries.<k>.up.weight``, whatever layers
the stage holds.

Token side path (``model.bottleneck_tokens``): every peer reads the job's data itself (no shared
disk), so the stage receiving a cut already knows the micro-batch's token ids, and the part of the
residual stream that is each token's own embedding need not cross the wire at all. With it, the
receiving side adds a learned table of its own, ``x' = c U^T + T[tokens]``. ``T`` starts as the
model's initial embedding (the same seeded draw the first stage makes) with the kept coordinates
zeroed, so at init an embedded token crosses a cut exactly: its first r coordinates in the codes, the
rest from ``T``; what the layers before the cut added outside the kept coordinates is what the cut
drops, and training moves ``D``, ``U`` and ``T`` to what the loss needs. Without it a cut of rank r
starts by dropping (d - r) / d of each token's identity as well, and the model spends its first
hundreds of steps re-learning to route it (docs/benchmarks.md, issue 22). No extra bytes: the ids
never travel.

Where the bottlenecks sit is part of the model, not of the plan: the first plan's cuts fix the
positions (``TrainPlan.bottlenecks``) and later plans keep them, wherever they cut the pipeline. A
stage holds the maps of every position in its range: the up-projection of one it starts at, the
down-projection of one it ends at, and both of one inside it, where it applies ``U D`` without the
wire. A cut at no position carries full d_model-wide hidden states. So a re-plan that moves the cuts
(churn, a faster peer) changes neither the function nor the learned maps; the model the swarm trains
is the reference's with the same positions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

_NAME = re.compile(r"^(?:model|optim)\.boundaries\.(\d+)\.(down|up|tokens)\.")


class Boundary(nn.Module):
    """The maps of one cut that a stage holds: ``down`` (it sends) and/or ``up`` (it receives), and with
    ``vocab`` the receiving side's token table ``tokens`` (vocab x d)."""

    def __init__(self, d_model: int, rank: int, down: bool, up: bool, vocab: int | None = None) -> None:
        super().__init__()
        if not 1 <= rank <= d_model:
            raise ValueError(f"bottleneck rank {rank} outside [1, d_model = {d_model}]")
        self.rank = rank
        self.down = nn.Linear(d_model, rank, bias=False) if down else None
        self.up = nn.Linear(rank, d_model, bias=False) if up else None
        self.tokens = nn.Embedding(vocab, d_model) if up and vocab is not None else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """``D`` = the first r rows of the identity, ``U = D^T``: exact on the kept coordinates."""
        for lin in (self.down, self.up):
            if lin is not None:
                rows, cols = lin.weight.shape
                lin.weight.copy_(torch.eye(rows, cols))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """(..., d) hidden states -> (..., r) codes."""
        if self.down is None:
            raise ValueError("this stage does not hold the down-projection of the cut")
        out: torch.Tensor = self.down(x)
        return out

    @torch.no_grad()
    def init_tokens(self, embedding: torch.Tensor) -> None:
        """``tokens`` = the model's initial embedding table with the kept coordinates (the first r, where
        ``D`` starts) zeroed: those arrive through the codes."""
        if self.tokens is None:
            raise ValueError("this side of the cut has no token table")
        self.tokens.weight.copy_(embedding)
        self.tokens.weight[:, : self.rank] = 0.0

    def decode(self, codes: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """(..., r) codes -> (..., d) hidden states; with a token table, plus the tokens' rows of it
        (``tokens``: the ids of the same (..., ) positions)."""
        if self.up is None:
            raise ValueError("this stage does not hold the up-projection of the cut")
        out: torch.Tensor = self.up(codes)
        if self.tokens is not None:
            if tokens is None:
                raise ValueError("this cut re-embeds the tokens: the stage needs the micro-batch's token ids")
            out = out + self.tokens(tokens)
        return out


def boundary_of(name: str) -> tuple[int, str] | None:
    """(cut k, "down" or "up") of a checkpoint tensor name ("model." or "optim." prefixed) of a
    bottleneck map (a token table counts as "up": the receiving side holds it); None for any other
    tensor."""
    m = _NAME.match(name)
    return None if m is None else (int(m.group(1)), "down" if m.group(2) == "down" else "up")


def stage_holds(name: str, first: int, last: int) -> bool:
    """Whether a stage of layers [first, last) holds the bottleneck tensor ``name`` if the job has a
    bottleneck there: the up-projection of a position in [first, last), the down-projection of one in
    (first, last]. Which positions exist is the tensors' business (only those are ever saved), so a
    range picks its maps without knowing them."""
    where = boundary_of(name)
    if where is None:
        return False
    k, side = where
    return first < k <= last if side == "down" else first <= k < last


def check_cuts(cuts: Iterable[int], n_layers: int) -> tuple[int, ...]:
    """Bottleneck positions, sorted and unique; ``ValueError`` for one that is not a layer boundary
    inside the model (0 < k < n_layers)."""
    out = tuple(sorted(set(cuts)))
    bad = [k for k in out if not 0 < k < n_layers]
    if bad:
        raise ValueError(f"bottleneck positions {bad} are not inside the model's layers (0, {n_layers})")
    return out


def maps_held(cuts: Iterable[int], first: int, last: int) -> tuple[bool, tuple[int, ...], bool]:
    """(an up-projection at ``first``, the positions inside (first, last), a down-projection at
    ``last``): the maps a stage of layers [first, last) holds among the positions ``cuts``."""
    positions = set(cuts)
    inside = tuple(sorted(k for k in positions if first < k < last))
    return first in positions, inside, last in positions
