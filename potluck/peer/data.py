"""Training data: a byte-level tokenizer, a built-in generated corpus, text directories, and the
deterministic, disjoint split of every global batch across data-parallel replicas.

Global step s uses sequences [s * B, (s + 1) * B) of the token stream (B = sequences per step), and
replica r of R takes every R-th of them starting at r: replicas never see the same sequence, the union
is the global batch, and any peer can recompute any replica's data from (step, r, R) alone, which is
what makes resuming and replacing a replica exact. The data position of a checkpoint is just the step.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path

import torch

from potluck.peer.errors import DataError

logger = logging.getLogger(__name__)

MAX_FILE_BYTES = 1 << 30  # a single text file larger than this is refused (read it in parts instead)


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocabulary 256, no unknown tokens, nothing to download."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def generated_corpus(n_chars: int, seed: int) -> str:
    """A built-in corpus with learnable structure: sums and comparisons in words and digits."""
    rng = random.Random(seed)
    names = ["ada", "bo", "cy", "di", "ed", "flo", "gus", "hal"]
    parts: list[str] = []
    size = 0
    while size < n_chars:
        a, b = rng.randrange(100), rng.randrange(100)
        who = rng.choice(names)
        line = rng.choice([
            f"{who} adds {a} and {b} to get {a + b}.",
            f"{a} plus {b} is {a + b}.",
            f"{who} says {max(a, b)} is more than {min(a, b)}." if a != b else f"{a} equals {b}.",
        ])  # fmt: skip
        parts.append(line)
        size += len(line) + 1
    return "\n".join(parts)[:n_chars]


def read_text_dir(path: Path) -> str:
    """Concatenate .txt files and the "text" fields of .jsonl files under ``path``, sorted by name."""
    if not path.is_dir():
        raise DataError(f"dataset directory {path} does not exist")
    files = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".jsonl") and p.is_file())
    if not files:
        raise DataError(f"dataset directory {path} holds no .txt or .jsonl files")
    texts = []
    for f in files:
        if f.stat().st_size > MAX_FILE_BYTES:
            raise DataError(f"{f} is larger than {MAX_FILE_BYTES} bytes")
        raw = f.read_text(encoding="utf-8", errors="replace")
        if f.suffix == ".txt":
            texts.append(raw)
            continue
        for lineno, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                texts.append(str(json.loads(line)["text"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DataError(f"{f}:{lineno}: expected a JSON object with a 'text' field") from None
    return "\n".join(texts)


class TokenDataset:
    """A token stream cut into sequences of ``seq_len + 1`` tokens (inputs and shifted targets)."""

    def __init__(self, tokens: list[int], seq_len: int) -> None:
        if len(tokens) < seq_len + 1:
            raise DataError(f"dataset has {len(tokens)} tokens, fewer than one sequence of {seq_len + 1}")
        self.seq_len = seq_len
        self.tokens = torch.tensor(tokens, dtype=torch.long)
        self.n_sequences = (len(tokens) - 1) // seq_len

    def sequence(self, index: int) -> torch.Tensor:
        """Sequence ``index`` (wrapping around the dataset: epochs repeat the same order)."""
        start = (index % self.n_sequences) * self.seq_len
        return self.tokens[start : start + self.seq_len + 1]

    def replica_batch(self, step: int, replica: int, n_replicas: int, per_step: int) -> torch.Tensor:
        """(sequences, seq_len + 1) for ``replica`` at global ``step``; ``per_step`` sequences in total."""
        if not 0 <= replica < n_replicas:
            raise ValueError(f"replica {replica} of {n_replicas}")
        indices = range(step * per_step + replica, (step + 1) * per_step, n_replicas)
        return torch.stack([self.sequence(i) for i in indices])

    def micro_batches(self, batch: torch.Tensor, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(inputs, targets) micro-batches of ``size`` sequences."""
        for chunk in batch.split(size):
            yield chunk[:, :-1], chunk[:, 1:]
