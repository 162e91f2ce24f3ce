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


def test_unpacked_tensors_share_the_stream_where_aligned():
    """The state arrives once in memory: a tensor starting at a multiple of its element size is a view
    of the received bytes; one that does not is copied out (torch needs aligned storage)."""
    tensors = {"a": torch.randn(3, 5), "b": torch.randn(7).to(torch.bfloat16), "c": torch.randn(4)}
    entries, data = pack(tensors)
    back = unpack(entries, data)
    start = torch.frombuffer(data, dtype=torch.uint8).data_ptr()
    inside = {k: start <= t.data_ptr() < start + len(data) for k, t in back.items()}
    assert inside == {"a": True, "b": True, "c": False}  # "c" starts at byte 74: not a float32 boundary
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)


def test_a_stage_built_unset_takes_the_loaded_tensors_as_its_weights():
    spec = OptimizerSpec()
    source = StageRunner(MODEL, 0, 2, seed=3, optimizer_spec=spec)
    saved = {k: v.clone() for k, v in source.state_tensors().items()}
    entries, data = pack(saved)
    loaded = unpack(entries, data)
    runner = StageRunner(MODEL, 0, 2, seed=3, optimizer_spec=spec, unset=True)
    runner.load_state_tensors(loaded, take=True)
    buffer = torch.frombuffer(data, dtype=torch.uint8).data_ptr()
    embed = runner.model.embed
    assert embed is not None and buffer <= embed.weight.data_ptr() < buffer + len(data)  # no copy
    ids = torch.randint(0, 256, (2, 16))
    assert torch.equal(runner.model(ids), source.model(ids))
    for p, q in zip(runner.params, source.params, strict=True):  # it trains like the stage it copied
        p.grad, q.grad = torch.ones_like(p), torch.ones_like(q)
    runner.step(lr=1e-3)
    source.step(lr=1e-3)
    assert all(torch.equal(p, q) for p, q in zip(runner.params, source.params, strict=True))
    with pytest.raises(RuntimeError, match="missing"):
        StageRunner(MODEL, 0, 2, seed=3, optimizer_spec=spec, unset=True).load_state_tensors(
            {k: v for k, v in saved.items() if "embed" not in k}
        )


def test_an_unset_stage_draws_the_maps_its_state_lacks():
    """State saved without a bottleneck map this stage has: the map starts from its identity init,
    as in a stage built with its draw."""
    spec = ModelSpec(n_layers=4, d_model=32, n_heads=2, vocab_size=256, seq_len=16, bottleneck_rank=8)
    plain = StageRunner(spec, 0, 2, seed=3, optimizer_spec=OptimizerSpec(), cuts=(3,))  # no map in [0, 2)
    saved = plain.state_tensors()
    drawn = StageRunner(spec, 0, 2, seed=3, optimizer_spec=OptimizerSpec(), cuts=(2,))
    unset = StageRunner(spec, 0, 2, seed=3, optimizer_spec=OptimizerSpec(), cuts=(2,), unset=True)
    for runner in (drawn, unset):
        runner.load_state_tensors(saved)
    a, b = drawn.model.state_dict(), unset.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_tensors_not_taken_stay_as_they_were_while_the_stage_trains():
    """This peer's held state (served to others) is copied into a stage, never taken: training the
    stage must not change what it serves."""
    spec = OptimizerSpec()
    held = {
        k: v.clone() for k, v in StageRunner(MODEL, 0, 2, seed=3, optimizer_spec=spec).state_tensors().items()
    }
    before = {k: v.clone() for k, v in held.items()}
    runner = StageRunner(MODEL, 0, 2, seed=3, optimizer_spec=spec, unset=True)
    runner.load_state_tensors(held)  # take=False: the default
    for p in runner.params:
        p.grad = torch.ones_like(p)
    runner.step(lr=1e-2)
    assert all(torch.equal(held[k], before[k]) for k in held)
    embed = runner.model.embed
    assert embed is not None and not torch.equal(embed.weight, before["model.embed.weight"])
