"""Tiny Hugging Face models made by ``transformers`` itself (a test dependency only), every parameter
drawn at random (norm gains and biases too, so a misplaced one shows in the logits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

LLAMA: dict[str, Any] = dict(  # grouped-query attention, untied, Llama 3.1's rotary scaling
    vocab_size=96,
    hidden_size=64,
    intermediate_size=80,
    num_hidden_layers=3,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
)
QWEN2: dict[str, Any] = dict(  # q/k/v biases, tied embeddings
    vocab_size=96,
    hidden_size=48,
    intermediate_size=72,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=True,
)


def make_model(
    kind: str, directory: Path, seed: int = 0, shape: dict[str, Any] | None = None, **save: Any
) -> Any:
    """A ``kind`` ("llama", "qwen2", "mistral") model with random parameters, saved to ``directory``;
    ``shape``: config fields changed from the kind's tiny default."""
    torch.manual_seed(seed)
    shape = shape or {}
    if kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**QWEN2 | shape))
    elif kind == "mistral":
        config = {k: v for k, v in LLAMA.items() if k not in ("rope_scaling", "rope_theta")} | shape
        model = transformers.MistralForCausalLM(transformers.MistralConfig(**config, sliding_window=None))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA | shape))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.1 + (1.0 if p.ndim == 1 else 0.0))  # gains near 1
    model.save_pretrained(directory, **save)
    return model.eval()
