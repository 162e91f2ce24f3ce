"""A stage's weights from a Hugging Face model directory, reading only its own tensors.

``model.safetensors`` alone or sharded (``model.safetensors.index.json`` names each tensor's file);
each tensor is read through safetensors' memory map as it is asked for, so a stage of a large model
costs its own share of memory, not the model's. Weights in bf16 or fp16 are widened to fp32 (potluck
trains fp32 master weights).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from potluck.model.errors import HubError
from potluck.model.hub.names import ENDS, layer_from_hf, stage_shapes
from potluck.protocol.checkpoints import sha256_file
from potluck.protocol.jobspec import ModelSpec

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
WEIGHTS_MEMO = "weights-sha256.json"  # beside the owner's checkpoints: weight files' hashes by size, time
MAX_INDEX_BYTES = 64 << 20  # an index lists names and file names; a real one is well under 1 MB


class HubWeights(contextlib.AbstractContextManager["HubWeights"]):
    """The tensors of a model directory by name, opened lazily (one handle per shard file)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: dict[str, Any] = {}
        self._stack = contextlib.ExitStack()
        self.where = self._index()  # tensor name -> shard file name

    def _index(self) -> dict[str, str]:
        index = self.directory / INDEX
        if index.is_file():
            if index.stat().st_size > MAX_INDEX_BYTES:
                raise HubError(f"{index}: larger than {MAX_INDEX_BYTES} bytes")
            try:
                weight_map = json.loads(index.read_bytes())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise HubError(f"{index}: not a safetensors index ({e})") from None
            if not isinstance(weight_map, dict) or not all(
                isinstance(v, str) and "/" not in v and v.endswith(".safetensors")
                for v in weight_map.values()
            ):
                raise HubError(f"{index}: weight_map must name .safetensors files in the directory")
            return {str(k): v for k, v in weight_map.items()}
        if not (self.directory / SINGLE).is_file():
            raise HubError(f"{self.directory}: neither {SINGLE} nor {INDEX} (safetensors weights) found")
        return {name: SINGLE for name in self._open(SINGLE).keys()}  # noqa: SIM118 (a handle, not a dict)

    def _open(self, file: str) -> Any:
        if file not in self._files:
            try:
                self._files[file] = self._stack.enter_context(
                    safe_open(str(self.directory / file), framework="pt", device="cpu")
                )
            except (OSError, SafetensorError) as e:
                raise HubError(f"{self.directory / file}: cannot open ({e})") from None
        return self._files[file]

    def get(self, name: str) -> torch.Tensor | None:
        """Tensor ``name`` as fp32 (a copy), or None when the directory has none of that name."""
        file = self.where.get(name)
        if file is None:
            return None
        try:
            return self._open(file).get_tensor(name).to(torch.float32)
        except SafetensorError as e:
            raise HubError(f"{self.directory / file}: cannot read {name} ({e})") from None

    def stage(self, spec: ModelSpec, first: int, last: int) -> dict[str, torch.Tensor]:
        """The model weights of layers [first, last) (with the embedding, final norm and head where the
        stage holds them), named as a ``StageModel``'s ``state_dict`` names them: layers local to
        ``first``; every shape checked against the spec. A tied model without ``lm_head.weight`` takes
        its head from the embedding."""
        shapes = stage_shapes(spec, first, last)
        out: dict[str, torch.Tensor] = {}
        for layer in range(first, last):
            try:
                tensors = layer_from_hf(spec, layer, self.get)
            except KeyError as e:
                raise HubError(f"{self.directory}: no tensor {e.args[0]} (layer {layer})") from None
            out |= {f"layers.{layer - first}.{k}": v for k, v in tensors.items()}
        for ours, theirs in ENDS.items():
            if ours not in shapes:
                continue
            tensor = self.get(theirs)
            if tensor is None and ours == "head.weight" and spec.tie_embeddings:
                tensor = self.get(ENDS["embed.weight"])
            if tensor is None:
                raise HubError(f"{self.directory}: no tensor {theirs}")
            out[ours] = tensor
        for name, tensor in out.items():
            if tuple(tensor.shape) != shapes[name]:
                got = tuple(tensor.shape)
                raise HubError(f"{self.directory}: {name} has shape {got}, the model needs {shapes[name]}")
        return out

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def stage_weights(directory: Path, spec: ModelSpec, first: int, last: int) -> dict[str, torch.Tensor]:
    """``HubWeights.stage`` of ``directory`` (opened for this one stage)."""
    with HubWeights(directory) as hub:
        return hub.stage(spec, first, last)


def weights_digest(directory: Path, memo: Path | None = None) -> str:
    """SHA-256 over the directory's weight files: each file's name and SHA-256, in name order (what
    the signed job names as ``model.weights_sha256``). ``memo``: a JSON file keeping each file's hash
    by its size and modification time, so a relaunch does not read gigabytes of unchanged weights
    again."""
    with HubWeights(directory) as hub:
        files = sorted(set(hub.where.values()))
    known: dict[str, object] = {}
    if memo is not None and memo.is_file():
        with contextlib.suppress(OSError, ValueError):
            known = dict(json.loads(memo.read_text()))
    outer = hashlib.sha256()
    for name in files:
        path = directory / name
        stat, key = path.stat(), str(path.resolve())
        entry = known.get(key)
        if not (
            isinstance(entry, list) and len(entry) == 3 and entry[:2] == [stat.st_size, stat.st_mtime_ns]
        ):
            entry = known[key] = [stat.st_size, stat.st_mtime_ns, sha256_file(path)]
        outer.update(f"{name}\0{entry[2]}\n".encode())
    if memo is not None:
        memo.parent.mkdir(parents=True, exist_ok=True)
        memo.write_text(json.dumps(known))
    return outer.hexdigest()
