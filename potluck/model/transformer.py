"""A decoder-only transformer (Llama-style: RMSNorm, rotary positions, SwiGLU) that splits into stages.

``StageModel(spec, first, last, seed)`` holds layers ``[first, last)``; the stage holding layer 0 also
embeds tokens, and the stage holding the final layer also applies the final norm and the output head
and computes the loss. Every layer is initialised from a generator seeded by (seed, layer index), so a
stage's weights do not depend on which other layers it holds: replicas of a stage start identical, and
chaining all stages equals the whole model (tested). The shape arithmetic (SwiGLU width, parameters per
layer) lives on ``ModelSpec``, which the planner shares; the tests pin this module's tensors to it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from potluck.model.bottleneck import Boundary, check_cuts, maps_held
from potluck.protocol.jobspec import ModelSpec, RopeScaling

EMBED, HEAD = -1, -2  # generator slots for the embedding and the output head


def layer_generator(seed: int, slot: int) -> torch.Generator:
    digest = hashlib.blake2b(f"potluck-init|{seed}|{slot}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:  # eps: ModelSpec.norm_eps
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def inverse_frequencies(
    head_dim: int, theta: float = 10000.0, scaling: RopeScaling | None = None
) -> torch.Tensor:
    """Rotary angle per position of each pair of a head's dims, (head_dim / 2,): ``theta ** (-2i /
    head_dim)``, with Llama 3.1's long-context rescaling when ``scaling`` is given (wavelengths longer than
    ``original / low_freq_factor`` positions slowed ``factor`` times, shorter than ``original /
    high_freq_factor`` kept, the band between blended linearly in ``original / wavelength``)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    if scaling is None:
        return inv
    wavelength = 2 * math.pi / inv
    slow = scaling.original_max_positions / scaling.low_freq_factor  # longer: divided by factor
    fast = scaling.original_max_positions / scaling.high_freq_factor  # shorter: unchanged
    scaled = torch.where(wavelength > slow, inv / scaling.factor, inv)
    blend = (scaling.original_max_positions / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - blend) * scaled / scaling.factor + blend * scaled
    between = (wavelength >= fast) & (wavelength <= slow)
    return torch.where(between, blended, scaled)


def rotary(
    seq_len: int, head_dim: int, theta: float = 10000.0, scaling: RopeScaling | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, (seq_len, head_dim / 2) each."""
    angles = torch.outer(
        torch.arange(seq_len, dtype=torch.float32), inverse_frequencies(head_dim, theta, scaling)
    )
    return angles.cos(), angles.sin()


def spec_rotary(spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The cos and sin tables of ``spec``'s sequence length, head width and rotary settings."""
    return rotary(spec.seq_len, spec.head_dim, spec.rope_theta, spec.rope_scaling)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (even, odd) of the last dim of x: (batch, heads, seq, head_dim). (Hugging Face
    checkpoints pair dim i with i + head_dim / 2; model/hub/names.py reorders q and k rows to match.)"""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        d, hidden = spec.d_model, spec.ffn_hidden  # the widths ModelSpec's parameter count assumes
        self.n_heads, self.n_kv_heads, self.head_dim = spec.n_heads, spec.kv_heads, spec.head_dim
        self.widths = [d, spec.kv_width, spec.kv_width]  # q, k, v rows of the fused projection
        self.attn_norm = RMSNorm(d, spec.norm_eps)
        self.qkv = nn.Linear(d, sum(self.widths), bias=spec.qkv_bias)
        self.proj = nn.Linear(d, d, bias=False)
        self.ffn_norm = RMSNorm(d, spec.norm_eps)
        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(self.widths, dim=-1)
        q = q.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (b, heads, t, head_dim)
        k, v = (z.view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2) for z in (k, v))
        q, k = apply_rotary(q, cos[:t], sin[:t]), apply_rotary(k, cos[:t], sin[:t])
        grouped = self.n_kv_heads != self.n_heads  # query head h reads key/value head h // (heads / kv)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        gate, up = self.gate_up(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class StageModel(nn.Module):
    """Layers [first, last) of the model, plus the embedding (first == 0) and the head (last == n).

    With ``spec.bottleneck_rank`` the stage also holds the maps of the job's bottleneck positions
    ``cuts`` (global layer boundaries, ``model/bottleneck.py``) in its range: the up-projection of one
    it starts at, the down-projection of one it ends at, both of one inside it. ``cuts`` None: the
    stage's own ends (first > 0, last < n) are the positions, as a plan without
    ``TrainPlan.bottlenecks`` has them."""

    def __init__(
        self, spec: ModelSpec, first: int, last: int, seed: int, cuts: Iterable[int] | None = None
    ) -> None:
        super().__init__()
        if not 0 <= first < last <= spec.n_layers:
            raise ValueError(f"stage layers [{first}, {last}) outside [0, {spec.n_layers})")
        self.spec, self.first, self.last = spec, first, last
        self.is_first, self.is_last = first == 0, last == spec.n_layers
        d = spec.d_model
        ends = [k for k in (first, last) if 0 < k < spec.n_layers]
        positions = check_cuts(ends if cuts is None else cuts, spec.n_layers)
        self.boundaries = nn.ModuleDict()  # position k -> its maps; empty without a bottleneck
        self.codes_in = self.codes_out = False  # whether r-wide codes, not hidden states, cross an end
        self.cuts: tuple[int, ...] = ()  # positions inside the stage: U D applied in place
        if spec.bottleneck_rank is not None:
            r, vocab = spec.bottleneck_rank, spec.vocab_size if spec.bottleneck_tokens else None
            self.codes_in, self.cuts, self.codes_out = maps_held(positions, first, last)
            if self.codes_in:
                self.boundaries[str(first)] = Boundary(d, r, down=False, up=True, vocab=vocab)
            for k in self.cuts:
                self.boundaries[str(k)] = Boundary(d, r, down=True, up=True, vocab=vocab)
            if self.codes_out:
                self.boundaries[str(last)] = Boundary(d, r, down=True, up=False)
        self.embed = nn.Embedding(spec.vocab_size, d) if self.is_first else None
        self.layers = nn.ModuleList(Block(spec) for _ in range(first, last))
        self.norm = RMSNorm(d, spec.norm_eps) if self.is_last else None
        self.head = nn.Linear(d, spec.vocab_size, bias=False) if self.is_last else None
        cos, sin = spec_rotary(spec)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.seed = seed
        self._init_weights(seed)

    @classmethod
    def unset(
        cls,
        spec: ModelSpec,
        first: int,
        last: int,
        seed: int,
        cuts: Iterable[int] | None,
        device: torch.device,
    ) -> StageModel:
        """The stage with its weights' memory reserved but not written (not resident until used), for a
        stage whose state is loaded next: no seeded draw, no second copy of the weights while the state
        arrives. ``init()`` draws what a load does not cover."""
        with torch.device("meta"):
            model = cls(spec, first, last, seed, cuts)
        model = model.to_empty(device=device)
        cos, sin = spec_rotary(spec)
        model.cos, model.sin = cos.to(device), sin.to(device)
        return model

    @torch.no_grad()
    def init(self) -> None:
        """Every weight as the constructor draws it (for a stage built ``unset``)."""
        for module in reversed(list(self.modules())):  # children first: a Boundary sets its maps last
            reset = getattr(module, "reset_parameters", None)
            if module is not self and callable(reset):
                reset()
            if isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
        self._init_weights(self.seed)

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        """Normal(0, 0.02) weights, output projections scaled by 1/sqrt(2 n_layers) (GPT-2 style)."""
        std, out_std = 0.02, 0.02 / math.sqrt(2 * self.spec.n_layers)
        if self.embed is not None:
            self.embed.weight.normal_(0.0, std, generator=layer_generator(seed, EMBED))
        for offset, block in enumerate(self.layers):
            assert isinstance(block, Block)
            gen = layer_generator(seed, self.first + offset)
            block.qkv.weight.normal_(0.0, std, generator=gen)
            if block.qkv.bias is not None:
                block.qkv.bias.zero_()
            block.proj.weight.normal_(0.0, out_std, generator=gen)
            block.gate_up.weight.normal_(0.0, std, generator=gen)
            block.down.weight.normal_(0.0, out_std, generator=gen)
        if self.head is not None:
            # a tied model's head starts as the embedding (trained apart across stages: docs/models.md)
            slot = EMBED if self.spec.tie_embeddings else HEAD
            self.head.weight.normal_(0.0, std, generator=layer_generator(seed, slot))
        receiving = [b for b in self.boundaries.values() if isinstance(b, Boundary) and b.tokens is not None]
        if receiving:
            # the token side path's tables (model/bottleneck.py) start from the very embedding the
            # first stage draws, whichever stage holds them (drawn again where the stage has none)
            if self.embed is not None:
                embedding = self.embed.weight
            else:
                embedding = torch.empty(self.spec.vocab_size, self.spec.d_model)
                embedding.normal_(0.0, std, generator=layer_generator(seed, EMBED))
            for b in receiving:
                b.init_tokens(embedding)

    def forward(self, x: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids (b, t) on the first stage, hidden states (b, t, d) elsewhere; returns hidden states,
        or logits (b, t, vocab) on the last stage. With a bottleneck, what crosses a cut is its codes
        (b, t, r) instead of hidden states, both ways. ``tokens``: the micro-batch's ids (b, t), which a
        stage after the first needs when ``needs_tokens`` (the token side path); the first stage's are
        ``x``."""
        tokens = x if self.is_first else tokens
        h = self.enter(x, tokens)
        for offset, block in enumerate(self.layers):
            h = self.after_layer(offset, block(h, self.cos, self.sin), tokens)
        if self.norm is not None and self.head is not None:
            h = self.head(self.norm(h))
        return h

    @property
    def needs_tokens(self) -> bool:
        """Whether this stage, not being the first, must be given the token ids with its inputs: it
        re-embeds them at a bottleneck it receives or holds inside (``model.bottleneck_tokens``)."""
        return self.spec.bottleneck_tokens and not self.is_first and (self.codes_in or bool(self.cuts))

    def enter(self, x: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """What the first layer of the stage takes: embedded tokens, or received hidden states (from a
        bottleneck's codes, up-projected, plus the token table's rows of ``tokens`` with one)."""
        h = self.embed(x) if self.embed is not None else x
        return self.boundary_at(self.first).decode(h, tokens) if self.codes_in else h

    def after_layer(self, offset: int, h: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """``h`` after the stage's layer ``offset``, through the bottleneck at the boundary after it: U D
        in place at a position inside the stage, the down-projection at a position it ends at."""
        k = self.first + offset + 1
        if k in self.cuts:
            cut = self.boundary_at(k)
            return cut.decode(cut.encode(h), tokens)
        if k == self.last and self.codes_out:
            return self.boundary_at(k).encode(h)
        return h

    @property
    def width_in(self) -> int:
        """Numbers per token this stage receives (a stage after the first): r at a bottleneck, else d."""
        return (self.spec.bottleneck_rank or 0) if self.codes_in else self.spec.d_model

    @property
    def width_out(self) -> int:
        """Numbers per token this stage sends (a stage before the last): r at a bottleneck, else d."""
        return (self.spec.bottleneck_rank or 0) if self.codes_out else self.spec.d_model

    def boundary_at(self, k: int) -> Boundary:
        """The maps this stage holds of the bottleneck at position ``k``."""
        cut = self.boundaries[str(k)]
        assert isinstance(cut, Boundary)
        return cut

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy; ``targets`` are the inputs shifted by one."""
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
