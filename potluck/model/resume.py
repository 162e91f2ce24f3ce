"""Loading a stage's layers from a checkpoint directory that may hold only some stages, cut differently.

With no shared disk, a peer's checkpoint directory holds the stages *it* wrote or copied (its own, and
the copies it keeps for stages with a single replica); the job owner's copy holds them all. A re-plan
after churn can also move layer boundaries: the new stage [first, last) may span parts of several old
stages. Checkpoint tensors name layers by their index inside the old stage, so they are mapped to global
layer indices (old first + local index) and back to the wanted stage's local indices. Embedding, final
norm and head keep their names: they belong to whichever stage holds layer 0 or the last layer; the
bottleneck maps of a cut (``model/bottleneck.py``) keep theirs and go to the stages on either side of it.

Whatever stages are present, the wanted layers must all be covered by stages of one cut (same stage
count and plan epoch), every one of them verified against its manifest, or ``CheckpointError`` says
what is missing.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import torch

from potluck.model.bottleneck import stage_holds
from potluck.model.checkpoint import load_stage
from potluck.protocol.checkpoints import (
    CheckpointRef,
    Manifest,
    StageMeta,
    parse_step,
    read_manifest,
    step_dir,
    step_dirs,
)
from potluck.protocol.errors import CheckpointError

logger = logging.getLogger(__name__)

_LAYER = re.compile(r"^(model|optim)\.layers\.(\d+)\.(.+)$")
_STAGE_FILE = re.compile(r"stage-(\d{3,})\.json")


def present_stages(directory: Path) -> list[Manifest]:
    """The readable stage manifests of one step directory, all of one cut: when stages written under
    different plans share the directory, those of the newest plan epoch (then the most stages) win."""
    step = parse_step(directory)
    if step is None or not directory.is_dir():
        raise CheckpointError(f"{directory}: not a step-NNNNNNNN checkpoint directory")
    found: list[Manifest] = []
    for path in sorted(directory.glob("stage-*.json")):
        m = _STAGE_FILE.fullmatch(path.name)
        if m is None:
            continue
        try:
            found.append(read_manifest(path, step, int(m.group(1))))
        except CheckpointError as e:  # one damaged stage must not hide the others
            logger.warning("skipping %s: %s", path, e)
    if not found:
        raise CheckpointError(f"{directory}: no readable stage manifests")
    cut = max({(m.meta.epoch, m.n_stages) for m in found})
    return [m for m in found if (m.meta.epoch, m.n_stages) == cut]


def load_layers(
    root: Path,
    step: int,
    first: int,
    last: int,
    n_layers: int,
    check: Callable[[StageMeta], None] | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors of layers [first, last) (plus embedding/head where this stage holds them), named as
    ``StageRunner.state_tensors`` names them for a stage starting at ``first``, from whichever stages of
    ``step`` are present under ``root``. ``check`` sees every used stage's meta before its tensors are
    used and raises CheckpointError for a foreign one."""
    directory = step_dir(root, step)
    out: dict[str, torch.Tensor] = {}
    covered: set[int] = set()
    for manifest in present_stages(directory):
        old_first, old_last = manifest.meta.first_layer, manifest.meta.last_layer  # validated by the reader
        overlaps = old_first < last and old_last > first
        ends = (first == 0 and old_first == 0) or (last == n_layers and old_last == n_layers)
        if not (overlaps or ends):
            continue
        ref = CheckpointRef(Path(root), step, manifest.n_stages)
        tensors, meta = load_stage(ref, manifest.stage)  # verifies the weights against the manifest
        if check is not None:
            check(meta)
        for name, tensor in tensors.items():
            m = _LAYER.match(name)
            if stage_holds(name, first, last):  # a bottleneck map at a position in this stage's range
                out[name] = tensor
                continue
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
        raise CheckpointError(f"checkpoint {directory} lacks layers {missing}")
    return out


def holds(root: Path, step: int, first: int, last: int) -> bool:
    """Whether ``root`` has stages of ``step`` whose manifests cover layers [first, last) (cheap: reads
    manifests only; the weights are verified when loaded)."""
    try:
        stages = present_stages(step_dir(root, step))
    except CheckpointError:
        return False
    covered = {x for m in stages for x in range(m.meta.first_layer, m.meta.last_layer)}
    return set(range(first, last)) <= covered


def kept(root: Path, limit: int = 8) -> list[tuple[int, int, int]]:
    """(step, first, last) of the newest checkpoint of each layer range kept under ``root``, newest
    first, at most ``limit``: what this disk can serve (manifests only; weights are checked on load)."""
    newest: dict[tuple[int, int], int] = {}
    for step, directory in step_dirs(root):
        try:
            stages = present_stages(directory)
        except CheckpointError:
            continue
        for m in stages:
            newest.setdefault((m.meta.first_layer, m.meta.last_layer), step)
    ranked = sorted(((s, a, b) for (a, b), s in newest.items()), reverse=True)
    return ranked[:limit]
