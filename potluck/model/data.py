"""Training data: tokenizers (bytes or a Hugging Face ``tokenizers`` file), a built-in generated corpus,
text directories (.txt, .jsonl, .parquet), and the deterministic, disjoint split of every global batch
across data-parallel replicas.

Global step s uses sequences [s * B, (s + 1) * B) of the token stream (B = sequences per step), and
replica r of R takes every R-th of them starting at r: replicas never see the same sequence, the union
is the global batch, and any peer can recompute any replica's data from (step, r, R) alone, which is
what makes resuming and replacing a replica exact. The data position of a checkpoint is just the step.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from potluck.model.errors import DataError
from potluck.protocol.jobspec import DataSpec

logger = logging.getLogger(__name__)

# A single data file (or a parquet file's text, uncompressed) larger than this is refused, in bytes.
MAX_FILE_BYTES = 1 << 30
TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
PIP_HINT = "pip install 'potluck[data]'"
# A Hugging Face tokenizer encodes the corpus in pieces cut after a newline: 16 Ki-character pieces
# encode ~2.5x faster than 1 Mi-character ones, and 256 of them per encode_batch call (parallel in
# Rust) bounds the Encoding objects (ids, offsets, masks: many bytes per token) alive at once.
_PIECE_CHARS = 1 << 14
_PIECES_PER_BATCH = 256


class Tokenizer(Protocol):
    """What training needs from a tokenizer: ids below ``vocab_size``, and text back for samples."""

    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocabulary 256, no unknown tokens, nothing to download."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face ``tokenizers`` JSON file. Special tokens are neither added nor stripped, so a
    concatenated corpus is not wrapped in one BOS/EOS pair and decode shows exactly what was trained on."""

    def __init__(self, inner: Any, path: Path) -> None:
        self.inner = inner
        self.path = path
        self.vocab_size: int = int(inner.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self.inner.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.inner.decode(ids, skip_special_tokens=False))

    def encode_corpus(self, text: str) -> torch.Tensor:
        """int32 ids of a large text, encoded in newline-cut pieces (identical on every peer)."""
        parts: list[np.ndarray] = []
        cut = pieces(text, _PIECE_CHARS)  # lazily: a second copy of a large corpus would not fit
        while batch := list(itertools.islice(cut, _PIECES_PER_BATCH)):
            encodings = self.inner.encode_batch(batch, add_special_tokens=False)
            parts.extend(np.asarray(enc.ids, dtype=np.int32) for enc in encodings)
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        return torch.from_numpy(ids)


def pieces(text: str, size: int) -> Iterator[str]:
    """``text`` cut into pieces of about ``size`` characters, each ending just after a newline when one
    is in reach, so tokens rarely straddle a cut; the pieces concatenate back to ``text``."""
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            newline = text.rfind("\n", start, end)
            end = newline + 1 if newline >= start else end
        yield text[start:end]
        start = end


def load_tokenizer(path: str | None) -> Tokenizer:
    """``None``: bytes. Otherwise a Hugging Face ``tokenizers`` JSON file (``tokenizer.json``)."""
    if path is None:
        return ByteTokenizer()
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(f"tokenizer file {file} does not exist")
    try:
        import tokenizers
    except ImportError:
        raise DataError(f"tokenizer {file} needs the 'tokenizers' package: {PIP_HINT}") from None
    try:
        inner = tokenizers.Tokenizer.from_file(str(file))
    except Exception as e:  # the Rust side raises a bare Exception for any unreadable file
        raise DataError(f"tokenizer file {file} is not a Hugging Face tokenizers JSON file: {e}") from None
    return HFTokenizer(inner, file)


def encode_corpus(tokenizer: Tokenizer, text: str) -> torch.Tensor:
    """1-D integer tensor of the ids of ``text``, without a Python int per token where avoidable:
    bytes come out as uint8 (1 byte per token), Hugging Face ids as int32."""
    if isinstance(tokenizer, ByteTokenizer):
        data = bytearray(text, "utf-8")  # writable, so torch.frombuffer shares it without a warning
        return torch.frombuffer(data, dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
    if isinstance(tokenizer, HFTokenizer):
        return tokenizer.encode_corpus(text)
    return torch.tensor(tokenizer.encode(text), dtype=torch.long)


def generated_corpus(n_chars: int, seed: int) -> str:
    """A built-in corpus with learnable structure: sums and comparisons in words and digits."""
    rng = random.Random(seed)
    names = ["ada", "bo", "cy", "di", "ed", "flo", "gus", "hal"]
    parts: list[str] = []
    size = 0
    while size < n_chars:
        a, b = rng.randrange(100), rng.randrange(100)
        who = rng.choice(names)
        line = rng.choice(
            [
                f"{who} adds {a} and {b} to get {a + b}.",
                f"{a} plus {b} is {a + b}.",
                f"{who} says {max(a, b)} is more than {min(a, b)}." if a != b else f"{a} equals {b}.",
            ]
        )
        parts.append(line)
        size += len(line) + 1
    return "\n".join(parts)[:n_chars]


def read_text_dir(path: Path) -> str:
    """Concatenate .txt files, the "text" fields of .jsonl files and the "text" column of .parquet files
    under ``path`` (recursively, sorted by path), one record per line."""
    if not path.is_dir():
        raise DataError(f"dataset directory {path} does not exist")
    files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())
    if not files:
        raise DataError(f"dataset directory {path} holds no .txt or .jsonl or .parquet files")
    texts: list[str] = []
    for f in files:
        if f.stat().st_size > MAX_FILE_BYTES:
            raise DataError(f"{f} is larger than {MAX_FILE_BYTES} bytes")
        if f.suffix == ".parquet":
            texts.extend(_read_parquet(f))
            continue
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


def _read_parquet(f: Path) -> list[str]:
    """The non-null strings of the "text" column of one parquet file."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"reading {f} needs the 'pyarrow' package: {PIP_HINT}") from None
    try:
        with pq.ParquetFile(f) as parquet:
            columns = list(parquet.schema_arrow.names)
            if "text" not in columns:
                raise DataError(f"{f} has no 'text' column (its columns: {', '.join(columns) or 'none'})")
            kind = parquet.schema_arrow.field("text").type
            if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
                raise DataError(f"{f}: column 'text' holds {kind}, expected strings")
            # The on-disk size is compressed; the cap is on the text it expands to. Metadata counts leaf
            # columns (nested columns have several), so "text" is found by its path, not its position.
            meta = parquet.metadata
            expanded = sum(
                chunk.total_uncompressed_size
                for g in range(meta.num_row_groups)
                for chunk in (meta.row_group(g).column(j) for j in range(meta.num_columns))
                if chunk.path_in_schema == "text"
            )
            if expanded > MAX_FILE_BYTES:
                raise DataError(f"{f}: column 'text' is {expanded} bytes uncompressed, over {MAX_FILE_BYTES}")
            column = parquet.read(columns=["text"]).column("text")
        if column.nbytes > MAX_FILE_BYTES:  # repeated strings stored once (dictionary pages) expand on read
            raise DataError(
                f"{f}: column 'text' is {column.nbytes} bytes uncompressed, over {MAX_FILE_BYTES}"
            )
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{f} is not a readable parquet file: {e}") from None
    return [s for s in column.to_pylist() if s is not None]


def load_dataset(spec: DataSpec, seq_len: int, vocab_size: int, seed: int) -> tuple[TokenDataset, Tokenizer]:
    """The job's token stream: its text source, tokenized, checked against the model's ``vocab_size``."""
    tokenizer = load_tokenizer(spec.tokenizer)
    if tokenizer.vocab_size > vocab_size:
        raise DataError(f"tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size is {vocab_size}")
    started = time.monotonic()
    if spec.source == "generated":
        text = generated_corpus(spec.generated_chars, seed)
    else:
        if not spec.path:
            raise DataError("data.source = 'directory' needs data.path")
        text = read_text_dir(Path(spec.path).expanduser())
    tokens = encode_corpus(tokenizer, text)
    logger.info(
        "data: %s source, %d chars -> %d tokens (vocab %d) in %.1f s",
        spec.source,
        len(text),
        len(tokens),
        tokenizer.vocab_size,
        time.monotonic() - started,
    )
    return TokenDataset(tokens, seq_len), tokenizer


class TokenDataset:
    """A token stream cut into sequences of ``seq_len + 1`` tokens (inputs and shifted targets).

    ``tokens`` is a list of ids or a 1-D integer tensor, kept as given (a uint8 or int32 stream stays
    1 or 4 bytes per token); sequences come out as int64."""

    def __init__(self, tokens: list[int] | torch.Tensor, seq_len: int) -> None:
        if isinstance(tokens, torch.Tensor):
            if (
                tokens.dim() != 1
                or tokens.is_floating_point()
                or tokens.is_complex()
                or tokens.dtype == torch.bool
            ):
                raise DataError(
                    f"token ids must be a 1-D integer tensor, got {tuple(tokens.shape)} {tokens.dtype}"
                )
            stream = tokens.contiguous()
        else:
            stream = torch.tensor(tokens, dtype=torch.long)
        if len(stream) < seq_len + 1:
            raise DataError(f"dataset has {len(stream)} tokens, fewer than one sequence of {seq_len + 1}")
        self.seq_len = seq_len
        self.tokens = stream
        self.n_sequences = (len(stream) - 1) // seq_len

    def sequence(self, index: int) -> torch.Tensor:
        """Sequence ``index`` (wrapping around the dataset: epochs repeat the same order)."""
        start = (index % self.n_sequences) * self.seq_len
        return self.tokens[start : start + self.seq_len + 1].long()

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
