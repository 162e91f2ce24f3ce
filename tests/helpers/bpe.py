"""A tiny byte-level BPE ``tokenizer.json`` made with the ``tokenizers`` package, for the tests that need
a real Hugging Face tokenizer file."""

from __future__ import annotations

from pathlib import Path

import pytest

from potluck.model.data import generated_corpus


def train_bpe(path: Path) -> Path:
    """A tiny byte-level BPE tokenizer (256 bytes + merges + one special token) saved as JSON."""
    tk = pytest.importorskip("tokenizers")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<eos>"],
        show_progress=False,
    )
    tok.train_from_iterator([generated_corpus(2_000, seed=s) for s in range(5)], trainer=trainer)
    file = path / "tokenizer.json"
    tok.save(str(file))
    return file
