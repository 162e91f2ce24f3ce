"""potluck's tensor names and layouts against a Hugging Face Llama-family checkpoint's.

Per layer, potluck fuses q, k and v into one ``qkv`` matrix (rows q, then k, then v) and the SwiGLU's
gate and up into ``gate_up``; rotary positions rotate pairs of neighbouring dims (2i, 2i + 1), where
``transformers`` pairs dim i with i + head_dim / 2. So q's and k's rows (and biases) are reordered
within each head on the way in and back on the way out: a permutation, exact both ways.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from potluck.protocol.jobspec import ModelSpec

HF_LAYER = "model.layers.{i}."
# potluck module -> HF tensors it is made of, per layer (the fused ones in row order)
LAYER_PARTS = {
    "attn_norm.weight": ("input_layernorm.weight",),
    "qkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "qkv.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "proj.weight": ("self_attn.o_proj.weight",),
    "ffn_norm.weight": ("post_attention_layernorm.weight",),
    "gate_up.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "down.weight": ("mlp.down_proj.weight",),
}
ENDS = {
    "embed.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "head.weight": "lm_head.weight",
}


def rotary_to_pairs(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """A q or k projection's rows (or bias) from the half-split rotary layout to neighbouring pairs."""
    head_dim = rows.shape[0] // heads
    rest = rows.shape[1:]
    return rows.reshape(heads, 2, head_dim // 2, *rest).transpose(1, 2).reshape(rows.shape).contiguous()


def rotary_to_halves(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of ``rotary_to_pairs``."""
    head_dim = rows.shape[0] // heads
    rest = rows.shape[1:]
    return rows.reshape(heads, head_dim // 2, 2, *rest).transpose(1, 2).reshape(rows.shape).contiguous()


def layer_from_hf(
    spec: ModelSpec, layer: int, get: Callable[[str], torch.Tensor | None]
) -> dict[str, torch.Tensor]:
    """Layer ``layer``'s potluck tensors (names relative to the layer: ``qkv.weight``, ...) from ``get``,
    which answers an HF tensor by name (None when the checkpoint has none of that name)."""
    prefix = HF_LAYER.format(i=layer)
    out: dict[str, torch.Tensor] = {}
    for ours, theirs in LAYER_PARTS.items():
        if ours == "qkv.bias" and not spec.qkv_bias:
            continue
        parts = [get(prefix + name) for name in theirs]
        missing = [prefix + n for n, t in zip(theirs, parts, strict=True) if t is None]
        if missing:
            raise KeyError(missing[0])
        tensors = [t for t in parts if t is not None]
        if ours.startswith("qkv."):
            tensors[0] = rotary_to_pairs(tensors[0], spec.n_heads)
            tensors[1] = rotary_to_pairs(tensors[1], spec.kv_heads)
        out[ours] = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
    return out


def layer_to_hf(spec: ModelSpec, layer: int, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of ``layer_from_hf``: layer ``layer``'s HF tensors from its potluck ones."""
    prefix = HF_LAYER.format(i=layer)
    widths = {"qkv": [spec.d_model, spec.kv_width, spec.kv_width], "gate_up": [spec.ffn_hidden] * 2}
    out: dict[str, torch.Tensor] = {}
    for ours, tensor in tensors.items():
        theirs = LAYER_PARTS[ours]
        parts = list(torch.split(tensor, widths[ours.split(".")[0]], dim=0)) if len(theirs) > 1 else [tensor]
        if ours.startswith("qkv."):
            parts[0] = rotary_to_halves(parts[0], spec.n_heads)
            parts[1] = rotary_to_halves(parts[1], spec.kv_heads)
        out |= {prefix + name: part.contiguous() for name, part in zip(theirs, parts, strict=True)}
    return out


def layer_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """The shapes of one layer's potluck tensors (the transformer's ``Block``; a test pins the two)."""
    d, kv, hidden = spec.d_model, spec.kv_width, spec.ffn_hidden
    shapes = {
        "attn_norm.weight": (d,),
        "qkv.weight": (d + 2 * kv, d),
        "proj.weight": (d, d),
        "ffn_norm.weight": (d,),
        "gate_up.weight": (2 * hidden, d),
        "down.weight": (d, hidden),
    }
    return shapes | ({"qkv.bias": (d + 2 * kv,)} if spec.qkv_bias else {})


def stage_shapes(spec: ModelSpec, first: int, last: int) -> dict[str, tuple[int, ...]]:
    """Every model tensor of a stage holding layers [first, last), named as its ``state_dict`` names them
    (bottleneck maps aside: potluck's own, not in any Hugging Face checkpoint)."""
    out = {f"layers.{i - first}.{k}": v for i in range(first, last) for k, v in layer_shapes(spec).items()}
    if first == 0:
        out["embed.weight"] = (spec.vocab_size, spec.d_model)
    if last == spec.n_layers:
        out |= {"norm.weight": (spec.d_model,), "head.weight": (spec.vocab_size, spec.d_model)}
    return out
