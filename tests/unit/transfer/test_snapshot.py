"""Stage tensors as one byte stream and back; layer names between local and global indices."""

import pytest
import torch

from potluck.model.stage import StageRunner
from potluck.protocol.jobspec import ModelSpec, OptimizerSpec
from potluck.transfer.errors import TransferError
from potluck.transfer.snapshot import check_covers, pack, rename, select, unpack

MODEL = ModelSpec(n_layers=4, d_model=32, n_heads=2, vocab_size=256, seq_len=16)


def test_pack_unpack_is_byte_identical_for_every_dtype():
    tensors = {
        "a": torch.randn(3, 5),
        "b": torch.randn(7).to(torch.bfloat16),
        "c": torch.tensor(4.0),
        "d": torch.arange(5, dtype=torch.int64),
        "e": torch.zeros(0, 3),
        "f": torch.tensor([True, False, True]),
        "g": torch.randn(4, 4).t(),  # not contiguous
    }
    entries, data = pack(tensors)
    assert [e.name for e in entries] == sorted(tensors)
    back = unpack(entries, data)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        assert torch.equal(back[name], t), name
    with pytest.raises(TransferError):
        unpack(entries, data + b"\0")


def test_names_move_between_local_and_global_layer_indices():
    runner = StageRunner(MODEL, 2, 4, 0, OptimizerSpec())
    local = runner.state_tensors()
    glob = rename(local, 2)
    assert "model.layers.1.qkv.weight" in local and "model.layers.3.qkv.weight" in glob
    assert "model.head.weight" in glob
    assert rename(glob, -2).keys() == local.keys()
    only3 = select(glob, 3, 4, MODEL.n_layers)
    assert {k.split(".")[2] for k in only3 if ".layers." in k} == {"3"}
    assert "model.head.weight" in only3 and "model.norm.weight" in only3
    assert "model.head.weight" not in select(glob, 2, 3, MODEL.n_layers)
    check_covers(only3, 3, 4, MODEL.n_layers, "test")
    with pytest.raises(TransferError, match="lacks"):
        check_covers(select(glob, 2, 3, MODEL.n_layers), 2, 4, MODEL.n_layers, "test")
