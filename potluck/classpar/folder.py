"""An image folder as a class-parallel job's data over the swarm: every peer reads its own copy, so the
copies must be the same bytes. ``folder_digest`` names a copy (the job owner's goes into the signed job,
``ClassParSpec.data_sha256``); ``folder_sets`` reads one, checks it, and splits it the same way on every
machine (per class, a seeded 20% for validation, at least one image)."""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path

import torch

from potluck.classpar import data
from potluck.classpar.errors import ImageFolderError

logger = logging.getLogger(__name__)

VAL_SHARE = 0.2  # of each class's images, held out for the accuracies records report
MAX_FILES = 1_000_000  # a folder larger than this is refused before it is read


def folder_digest(root: str | Path) -> str:
    """SHA-256 over the class folders' image files: relative path and contents, in sorted order."""
    base = Path(root)
    files = [p for _, paths in data.image_files(base) for p in paths]  # what load_image_folder reads
    if len(files) > MAX_FILES:
        raise ImageFolderError(f"{base}: {len(files)} images, more than {MAX_FILES}")
    h = hashlib.sha256()
    for path in files:
        rel = path.relative_to(base).as_posix().encode()
        h.update(len(rel).to_bytes(4, "little") + rel)
        blob = path.read_bytes()
        h.update(len(blob).to_bytes(8, "little") + blob)
    return h.hexdigest()


@functools.lru_cache(maxsize=2)
def folder_sets(
    root: str, classes: int, seed: int, digest: str | None = None
) -> tuple[data.ImageSet, data.ImageSet]:
    """(train, validation) from the folder at ``root``: ``ImageFolderError`` unless it holds ``classes``
    class subdirectories and, when ``digest`` is given, is the copy it names."""
    if digest is not None and (mine := folder_digest(root)) != digest:
        raise ImageFolderError(
            f"{root}: this copy of the job's images (sha256 {mine[:12]}) is not the owner's "
            f"({digest[:12]}); sync it before joining"
        )
    images = data.load_image_folder(root)
    if images.num_classes != classes:
        raise ImageFolderError(f"{root}: {images.num_classes} class folders, the job says {classes}")
    gen = torch.Generator().manual_seed(seed)
    train_idx: list[torch.Tensor] = []
    val_idx: list[torch.Tensor] = []
    for c in range(classes):
        members = torch.nonzero(images.y == c).flatten()
        order = members[torch.randperm(len(members), generator=gen)]
        n_val = max(1, round(VAL_SHARE * len(order))) if len(order) > 1 else 0
        val_idx.append(order[:n_val])
        train_idx.append(order[n_val:])
    train, val = images.subset(torch.cat(train_idx)), images.subset(torch.cat(val_idx))
    logger.info("image folder %s: %d training and %d validation images", root, len(train), len(val))
    return train, val
