"""Resuming a stage from a checkpoint that may have been cut into stages differently.

A re-plan after churn can move layer boundaries: the new stage [first, last) may span parts of several
old stages. Checkpoint tensors name layers by their index inside the old stage, so they are mapped to
global layer indices (old first + local index) and back to this stage's local indices. Embedding, final
norm and head keep their names: they belong to whichever stage holds layer 0 or the last layer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import torch

from potluck.model.checkpoint import check_step, load_stage, step_dir
from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.errors import CheckpointError

_LAYER = re.compile(r"^(model|optim)\.layers\.(\d+)\.(.+)$")


def load_layers(
    root: Path,
    step: int,
    first: int,
    last: int,
    n_layers: int,
    check: Callable[[StageMeta], None] | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors of layers [first, last) (plus embedding/head where this stage holds them), named as
    ``StageRunner.state_tensors`` names them for a stage starting at ``first``. ``check`` sees every
    stage's meta before its tensors are used and raises CheckpointError for a foreign one."""
    full = check_step(step_dir(root, step))  # every stage present and intact, or CheckpointError
    n_stages = full.n_stages
    out: dict[str, torch.Tensor] = {}
    covered: set[int] = set()
    for stage in range(n_stages):
        tensors, meta = load_stage(full, stage)
        if check is not None:
            check(meta)
        old_first, old_last = meta.first_layer, meta.last_layer  # validated by the manifest reader
        overlaps = old_first < last and old_last > first
        ends = (first == 0 and old_first == 0) or (last == n_layers and old_last == n_layers)
        if not (overlaps or ends):
            continue
        for name, tensor in tensors.items():
            m = _LAYER.match(name)
            if m is None:  # embedding, final norm, head: kept where this stage has them
                _, _, rest = name.partition(".")
                base = rest.split(".")[0]
                if (base == "embed" and first == 0) or (base in ("norm", "head") and last == n_layers):
                    out[name] = tensor
                continue
            layer = old_first + int(m.group(2))
            if first <= layer < last:
                out[f"{m.group(1)}.layers.{layer - first}.{m.group(3)}"] = tensor
                covered.add(layer)
    missing = sorted(set(range(first, last)) - covered)
    if missing:
        raise CheckpointError(f"checkpoint {full.path} lacks layers {missing}")
    return out
