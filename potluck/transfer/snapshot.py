"""A stage's state as a holder offers it, and its tensors as one byte stream and back.

``StageRunner.state_tensors`` names layers by their index inside the stage ("model.layers.0...");
between peers whose stages are cut differently names use GLOBAL layer indices instead, so a fetcher can
ask for any layers [first, last) a holder covers and rename them to its own local indices. Embedding,
final norm and head keep their names and travel with whichever range starts at layer 0 or ends at the
last layer (the same rule as ``resume.load_layers``); a cut's bottleneck maps keep theirs and travel
with the ranges on either side of the cut.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from potluck.model.bottleneck import boundary_of, stage_holds
from potluck.protocol.checkpoints import StageMeta
from potluck.transfer.errors import TransferError
from potluck.transfer.manifest import ITEMSIZE, TensorEntry

_LAYER = re.compile(r"^(model|optim)\.layers\.(\d+)\.(.+)$")
_ENDS = {"embed": "first", "norm": "last", "head": "last"}  # non-layer modules: which end holds them


@dataclass(frozen=True)
class StageState:
    """The state of one stage after ``meta.step`` steps: tensors named as ``state_tensors`` names them.

    The tensors must not change while offered (pass copies of a model that keeps training). The data
    position needs no field: global step s reads sequences [s B, (s + 1) B) of the token stream, so the
    step is the position (docs/training.md)."""

    meta: StageMeta
    tensors: dict[str, torch.Tensor]

    @property
    def step(self) -> int:
        return self.meta.step


def rename(tensors: dict[str, torch.Tensor], shift: int) -> dict[str, torch.Tensor]:
    """Layer names with ``shift`` added to their index (local -> global: +first; global -> local: -first)."""
    out = {}
    for name, tensor in tensors.items():
        m = _LAYER.match(name)
        out[name if m is None else f"{m.group(1)}.layers.{int(m.group(2)) + shift}.{m.group(3)}"] = tensor
    return out


def layer_of(name: str) -> int | str:
    """The global layer index of a (globally named) tensor, or its module ("embed", "norm", "head")."""
    m = _LAYER.match(name)
    if m is not None:
        return int(m.group(2))
    return name.partition(".")[2].split(".")[0]


def select(tensors: dict[str, torch.Tensor], first: int, last: int, n_layers: int) -> dict[str, torch.Tensor]:
    """The globally named tensors of layers [first, last), plus the ends that range holds."""
    out = {}
    for name, tensor in tensors.items():
        where = layer_of(name)
        if isinstance(where, int):
            keep = first <= where < last
        elif boundary_of(name) is not None:  # a bottleneck map: the stages on either side of its cut
            keep = stage_holds(name, first, last)
        else:
            keep = (_ENDS.get(where) == "first" and first == 0) or (
                _ENDS.get(where) == "last" and last == n_layers
            )
        if keep:
            out[name] = tensor
    return out


def check_covers(tensors: dict[str, torch.Tensor], first: int, last: int, n_layers: int, source: str) -> None:
    """``TransferError`` unless every layer of [first, last) and the ends it needs are present."""
    present = {layer_of(name) for name in tensors}
    wanted: set[int | str] = set(range(first, last))
    wanted |= {"embed"} if first == 0 else set()
    wanted |= {"norm", "head"} if last == n_layers else set()
    missing = sorted(map(str, wanted - present))
    if missing:
        raise TransferError(f"state from {source} lacks layers/modules {missing}")


def _dtype_name(tensor: torch.Tensor) -> str:
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in ITEMSIZE:
        raise ValueError(f"dtype {tensor.dtype} cannot travel in a state transfer")
    return name


def pack(tensors: dict[str, torch.Tensor]) -> tuple[tuple[TensorEntry, ...], bytearray]:
    """The manifest entries (sorted by name) and the tensors' bytes, concatenated in that order."""
    cpu = {name: tensors[name].detach().to("cpu").contiguous() for name in sorted(tensors)}
    entries = tuple(TensorEntry(name, _dtype_name(t), tuple(t.shape)) for name, t in cpu.items())
    data = bytearray(sum(e.nbytes for e in entries))
    view = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    offset = 0
    for e, t in zip(entries, cpu.values(), strict=True):
        view[offset : offset + e.nbytes].copy_(t.reshape(-1).view(torch.uint8))
        offset += e.nbytes
    return entries, data


def unpack(entries: tuple[TensorEntry, ...], data: bytearray) -> dict[str, torch.Tensor]:
    """Tensors from the byte stream ``pack`` made: views of ``data`` where a tensor starts at a multiple
    of its element size (no second copy of the state: a stage takes them as its weights), copies into
    aligned storage elsewhere."""
    out, offset = {}, 0
    view = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    for e in entries:
        n, dtype = e.nbytes, getattr(torch, e.dtype)
        raw = view[offset : offset + n]
        raw = raw if offset % dtype.itemsize == 0 else raw.clone()
        out[e.name] = raw.view(dtype).reshape(e.shape)
        offset += n
    if offset != len(data):
        raise TransferError(f"state stream has {len(data)} bytes, its tensors {offset}")
    return out
