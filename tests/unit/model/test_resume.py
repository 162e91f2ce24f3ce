"""Loading layers from a directory that holds only some stages (a peer's own disk), cut differently."""

import pytest
import torch

from potluck.model.checkpoint import save_stage
from potluck.model.resume import holds, kept, load_layers, present_stages
from potluck.protocol.checkpoints import step_dir
from potluck.protocol.errors import CheckpointError
from tests.unit.model.test_checkpoint import SPEC, meta_for


def layer_tensors(first: int, last: int, tag: float) -> dict[str, torch.Tensor]:
    """Tensors of layers [first, last) named as a stage starting at ``first`` names them."""
    return {f"model.layers.{i - first}.w": torch.full((2,), tag + i) for i in range(first, last)}


def save(root, step: int, stage: int, n_stages: int, first: int, last: int, epoch: int = 1) -> None:
    meta = meta_for(step, stage, n_stages, first_layer=first, last_layer=last, epoch=epoch)
    save_stage(root, layer_tensors(first, last, 100.0 * step), meta)


def test_a_peer_disk_with_one_stage_serves_the_layers_it_has_and_refuses_the_rest(tmp_path):
    save(tmp_path, 10, 1, 2, 1, 3)  # this peer ran stage 1 (layers 1-2) of a 2-stage plan
    got = load_layers(tmp_path, 10, 2, 3, SPEC.n_layers)
    assert list(got) == ["model.layers.0.w"] and torch.equal(
        got["model.layers.0.w"], torch.full((2,), 1002.0)
    )
    assert holds(tmp_path, 10, 1, 3) and not holds(tmp_path, 10, 0, 2) and not holds(tmp_path, 20, 1, 3)
    with pytest.raises(CheckpointError, match=r"lacks layers \[0\]"):
        load_layers(tmp_path, 10, 0, 2, SPEC.n_layers)


def test_stages_of_two_disks_are_recut_across_the_old_boundary(tmp_path):
    save(tmp_path, 10, 0, 2, 0, 1)
    save(tmp_path, 10, 1, 2, 1, 3)  # a copy it keeps of the other stage
    got = load_layers(tmp_path, 10, 0, 2, SPEC.n_layers)
    assert torch.equal(got["model.layers.1.w"], torch.full((2,), 1001.0))


def test_only_the_newest_cut_of_a_step_is_used(tmp_path):
    save(tmp_path, 10, 1, 3, 1, 2, epoch=1)
    save(tmp_path, 10, 0, 2, 0, 2, epoch=2)  # the same step again, under a later 2-stage plan
    assert [m.n_stages for m in present_stages(step_dir(tmp_path, 10))] == [2]


def test_kept_lists_the_newest_step_of_each_layer_range(tmp_path):
    save(tmp_path, 10, 0, 2, 0, 1)
    save(tmp_path, 20, 0, 2, 0, 1)
    save(tmp_path, 10, 1, 2, 1, 3)  # a copy of another stage, at an older step
    assert kept(tmp_path) == [(20, 0, 1), (10, 1, 3)]
    assert kept(tmp_path / "nothing-here") == []
