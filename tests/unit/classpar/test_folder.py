"""A class-parallel job on an image folder: every peer reads its own copy, checked against the owner's
digest, and splits it the same way; the job file says how many classes it holds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from potluck.classpar import recipe
from potluck.classpar.errors import ClassParallelError, ImageFolderError
from potluck.classpar.folder import folder_digest, folder_sets
from potluck.classpar.swarm.service import with_data_digest
from potluck.protocol.errors import JobSpecError
from potluck.protocol.jobspec import parse_job


def _folder(root: Path, classes: int = 3, per_class: int = 6) -> Path:
    """``classes`` folders of ``per_class`` 12 x 12 .npy images: class c is a bright band at row 4c."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class-{c}").mkdir(parents=True)
        for i in range(per_class):
            img = rng.normal(0.0, 0.1, (12, 12)).astype(np.float32)
            img[4 * c : 4 * c + 3] += 1.0
            np.save(root / f"class-{c}" / f"{i}.npy", img)
    return root


def _job(folder: Path, **section: object) -> dict[str, object]:
    spec = {"groups": 3, "classes": 3, "teacher_epochs": 2, "retrain_epochs": 1, "widths": [4, 4], **section}
    return {
        "name": "folders",
        "kind": "class_parallel",
        "data": {"source": "directory", "path": str(folder)},
        "class_parallel": spec,
    }


def test_every_copy_splits_alike_and_a_different_copy_is_refused(tmp_path):
    root = _folder(tmp_path / "mine")
    folder_sets.cache_clear()
    train, val = folder_sets(str(root), 3, seed=7)
    assert (len(train), len(val)) == (15, 3)  # a fifth of each class's six held out
    assert sorted(val.y.tolist()) == [0, 1, 2]
    twin = _folder(tmp_path / "twin")  # the same bytes elsewhere: the same digest, the same split
    assert folder_digest(twin) == folder_digest(root)
    train2, _ = folder_sets(str(twin), 3, seed=7, digest=folder_digest(root))
    assert train2.y.tolist() == train.y.tolist()
    np.save(twin / "class-1" / "0.npy", np.zeros((12, 12), dtype=np.float32))  # one image differs
    folder_sets.cache_clear()
    with pytest.raises(ImageFolderError, match="not the owner's"):
        folder_sets(str(twin), 3, seed=7, digest=folder_digest(root))
    with pytest.raises(ImageFolderError, match="3 class folders, the job says 4"):
        folder_sets(str(root), 4, seed=7)


def test_the_job_file_names_the_class_count_and_launch_pins_the_owners_copy(tmp_path):
    root = _folder(tmp_path / "images")
    with pytest.raises(JobSpecError, match=r"needs class_parallel\.classes"):
        parse_job(_job(root, classes=None))
    with pytest.raises(JobSpecError, match="procedural image set has 10 classes"):
        parse_job({"name": "bars", "kind": "class_parallel", "class_parallel": {"groups": 2, "classes": 4}})
    job = parse_job(_job(root))
    assert job.class_parallel is not None and job.class_parallel.num_classes == 3
    pinned = with_data_digest(job)
    assert pinned.class_parallel is not None and pinned.class_parallel.data_sha256 == folder_digest(root)
    assert with_data_digest(pinned) is pinned  # already pinned: unchanged


def test_a_teacher_trains_on_the_folder_and_a_peer_without_a_copy_is_told(tmp_path):
    root = _folder(tmp_path / "images")
    job = with_data_digest(parse_job(_job(root)))
    assert job.class_parallel is not None
    folder_sets.cache_clear()
    teacher, feats, acc = recipe.train_teacher(job.class_parallel, job.seed, str(root))
    assert feats.shape[0] == 3 and 0.0 <= acc <= 1.0 and teacher.num_outputs == 3
    assert 0.0 <= recipe.group_accuracy(teacher, [0], job.class_parallel, job.seed, str(root)) <= 1.0
    with pytest.raises(ClassParallelError, match="--data-dir"):
        recipe.train_teacher(job.class_parallel, job.seed, None)
