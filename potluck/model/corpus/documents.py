"""The documents of a data directory, one string at a time (never the corpus at once).

A ``.txt`` file is one document; a ``.jsonl`` line, a ``.parquet`` row and a row of a directory written by
``datasets.save_to_disk`` (its ``*.arrow`` files; a ``DatasetDict``'s train split) are one each, their
``text_field`` column or key.
Files are taken in path order; empty documents are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from potluck.model.errors import DataError

SUFFIXES = (".txt", ".jsonl", ".parquet", ".arrow")
MAX_DOCUMENT_BYTES = 1 << 30  # a .txt file, a .jsonl line: one document, held whole while tokenized
PIP_HINT = "pip install 'potluck[data]'"


def source_files(path: Path) -> list[Path]:
    """Every readable document file under ``path``, sorted; DataError when there is none. Of a
    ``DatasetDict`` saved with ``save_to_disk`` (a ``dataset_dict.json`` beside its splits), only the
    ``train`` split is read: the others are held out."""
    if not path.is_dir():
        raise DataError(f"dataset directory {path} does not exist")
    splits = [d.parent for d in path.rglob("dataset_dict.json")]

    def held_out(f: Path) -> bool:
        return any(root in f.parents and root / "train" not in f.parents for root in splits)

    files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file() and not held_out(p))
    if not files:
        raise DataError(f"dataset directory {path} holds no {', '.join(SUFFIXES)} files")
    return files


def documents(files: list[Path], text_field: str = "text") -> Iterator[str]:
    for f in files:
        if f.suffix == ".txt":
            if f.stat().st_size > MAX_DOCUMENT_BYTES:
                raise DataError(f"{f} is larger than {MAX_DOCUMENT_BYTES} bytes (one document)")
            text = f.read_text(encoding="utf-8", errors="replace")
            if text:
                yield text
        elif f.suffix == ".jsonl":
            yield from _jsonl(f, text_field)
        else:
            yield from _arrow(f, text_field)


def _jsonl(f: Path, field: str) -> Iterator[str]:
    with f.open("rb") as lines:
        for lineno, line in enumerate(lines, 1):
            if len(line) > MAX_DOCUMENT_BYTES:
                raise DataError(f"{f}:{lineno}: a line over {MAX_DOCUMENT_BYTES} bytes")
            if not line.strip():
                continue
            try:
                text = json.loads(line)[field]
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
                raise DataError(f"{f}:{lineno}: expected a JSON object with a {field!r} field") from None
            if text:
                yield str(text)


def _arrow(f: Path, field: str) -> Iterator[str]:
    """Rows of a parquet file or of an Arrow IPC stream (``datasets.save_to_disk``), batch by batch."""
    try:
        import pyarrow as pa
        import pyarrow.ipc as ipc
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"reading {f} needs the 'pyarrow' package: {PIP_HINT}") from None
    try:
        if f.suffix == ".parquet":
            parquet = pq.ParquetFile(f)
            schema, batches = parquet.schema_arrow, parquet.iter_batches(batch_size=1024, columns=[field])
        else:
            reader = ipc.open_stream(pa.memory_map(str(f)))
            schema, batches = reader.schema, iter(reader)
        if field not in schema.names:
            raise DataError(f"{f} has no {field!r} column (its columns: {', '.join(schema.names) or 'none'})")
        kind = schema.field(field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise DataError(f"{f}: column {field!r} holds {kind}, expected strings")
        for batch in batches:
            for text in batch.column(batch.schema.get_field_index(field)).to_pylist():
                if text:
                    yield text
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{f} is not a readable {f.suffix[1:]} file: {e}") from None
