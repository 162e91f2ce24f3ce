"""Per-stage checkpoints: atomic writes, completeness, damage detection and fallback, pruning, StageMeta."""

import json
import logging
import threading

import pytest
import torch

from potluck.model.checkpoint import (
    MAX_MANIFEST_BYTES,
    CheckpointRef,
    check_step,
    latest_complete,
    load_stage,
    prune,
    save_stage,
)
from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.errors import CheckpointError, ProtocolError
from potluck.protocol.jobspec import ModelSpec

SPEC = ModelSpec(n_layers=8, d_model=32, n_heads=2, vocab_size=256, seq_len=16)


def meta_for(step: int, stage: int, n_stages: int, **changes: object) -> StageMeta:
    """The meta the trainer would write for ``stage`` (layer ``stage`` alone) of ``n_stages`` at ``step``."""
    fields: dict[str, object] = {
        "job": "j",
        "step": step,
        "stage": stage,
        "n_stages": n_stages,
        "first_layer": 0,
        "last_layer": 1,
        "model": SPEC,
        "seed": 0,
        "tokenizer": None,
        "epoch": 1,
    }
    if 0 <= stage < SPEC.n_layers:
        fields.update(first_layer=stage, last_layer=stage + 1)
    return StageMeta(**{**fields, **changes})  # type: ignore[arg-type]


def tensors_for(stage: int, step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + stage)
    return {
        "model.w": torch.randn(8, 4, generator=gen),
        "model.b": torch.randn(4, generator=gen).to(torch.bfloat16),
        "optim.count": torch.tensor([step, stage], dtype=torch.int64),
    }


def save_all(root, step: int, n_stages: int) -> None:
    for j in range(n_stages):
        save_stage(root, tensors_for(j, step), meta_for(step, j, n_stages))


def test_roundtrip_is_bit_exact(tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "a": torch.randn(5, 7, generator=gen),
        "a_t": torch.randn(5, 7, generator=gen).t(),  # non-contiguous view
        "half": torch.randn(3, generator=gen).half(),
        "bf16": torch.randn(3, generator=gen).bfloat16(),
        "ids": torch.arange(10, dtype=torch.int64),
        "scalar": torch.tensor(3.5),
    }
    tensors["a"][0, 0] = float("nan")  # bit-exact includes NaN payloads
    meta = meta_for(12, 0, 1, tokenizer="tok.json", seed=2**63 - 1)
    path = save_stage(tmp_path, tensors, meta)
    assert path == tmp_path / "step-00000012"
    assert sorted(p.name for p in path.iterdir()) == ["stage-000.json", "stage-000.safetensors"]
    ref = latest_complete(tmp_path)
    assert ref == CheckpointRef(tmp_path, 12, 1) and ref.path == path
    loaded, loaded_meta = load_stage(ref, 0)
    assert loaded_meta == meta
    assert loaded.keys() == tensors.keys()
    for k, t in tensors.items():
        assert loaded[k].dtype == t.dtype and loaded[k].shape == t.shape
        assert loaded[k].reshape(-1).view(torch.uint8).equal(t.reshape(-1).view(torch.uint8)), k


def test_completeness_requires_every_stage(tmp_path):
    save_all(tmp_path, 3, 2)
    save_stage(tmp_path, tensors_for(0, 5), meta_for(5, 0, 2))
    assert latest_complete(tmp_path).step == 3
    assert latest_complete(tmp_path, n_stages=2).step == 3
    assert latest_complete(tmp_path, n_stages=3) is None  # no step has three stages
    save_stage(tmp_path, tensors_for(1, 5), meta_for(5, 1, 2))
    assert latest_complete(tmp_path) == CheckpointRef(tmp_path, 5, 2)


def test_missing_manifest_makes_the_step_incomplete(tmp_path, caplog):
    save_all(tmp_path, 1, 2)
    save_all(tmp_path, 2, 2)
    (tmp_path / "step-00000002" / "stage-001.json").unlink()
    with caplog.at_level(logging.WARNING, logger="potluck.model.checkpoint"):
        assert latest_complete(tmp_path).step == 1
    assert "stage-001.json" in caplog.text and "missing" in caplog.text


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_damaged_weights_fall_back_to_previous_step(tmp_path, caplog, damage):
    save_all(tmp_path, 1, 2)
    save_all(tmp_path, 2, 2)
    weights = tmp_path / "step-00000002" / "stage-001.safetensors"
    data = bytearray(weights.read_bytes())
    if damage == "truncate":
        weights.write_bytes(data[:-10])
    elif damage == "flip":
        data[-3] ^= 0x01  # one bit in the last tensor's payload: same size, different hash
        weights.write_bytes(bytes(data))
    else:
        weights.unlink()
    with caplog.at_level(logging.WARNING, logger="potluck.model.checkpoint"):
        ref = latest_complete(tmp_path)
    assert ref is not None and ref.step == 1
    assert "step-00000002" in caplog.text and "stage-001.safetensors" in caplog.text
    expected = {"truncate": "truncated", "flip": "sha256", "delete": "missing"}[damage]
    assert expected in caplog.text
    with pytest.raises(CheckpointError, match=r"stage-001\.safetensors"):
        load_stage(CheckpointRef(tmp_path, 2, 2), 1)
    load_stage(CheckpointRef(tmp_path, 2, 2), 0)  # the undamaged stage still loads


def test_leftover_temp_files_are_ignored(tmp_path):
    save_all(tmp_path, 4, 2)
    save_stage(tmp_path, tensors_for(0, 6), meta_for(6, 0, 2))
    step6 = tmp_path / "step-00000006"
    # what a writer killed mid-save leaves behind
    (step6 / ".stage-001.safetensors.abc123.tmp").write_bytes(b"half a file")
    (step6 / ".stage-001.json.def456.tmp").write_text('{"format": ')
    (tmp_path / "step-00000004" / ".stage-000.safetensors.x.tmp").write_bytes(b"junk")
    (tmp_path / "step-00000009.tmp").mkdir()  # not a step directory name
    assert latest_complete(tmp_path).step == 4
    load_stage(CheckpointRef(tmp_path, 4, 2), 0)


def test_no_temp_files_left_after_saves(tmp_path):
    save_all(tmp_path, 0, 3)
    save_all(tmp_path, 0, 3)  # rewrite in place
    names = sorted(p.name for p in (tmp_path / "step-00000000").iterdir())
    assert names == [f"stage-{j:03d}.{ext}" for j in range(3) for ext in ("json", "safetensors")]
    assert latest_complete(tmp_path).step == 0


def test_malformed_and_oversized_manifests_are_damage(tmp_path, caplog):
    save_all(tmp_path, 1, 2)
    save_all(tmp_path, 2, 2)
    save_all(tmp_path, 3, 2)
    (tmp_path / "step-00000003" / "stage-000.json").write_text("{not json")
    manifest = tmp_path / "step-00000002" / "stage-000.json"
    doc = json.loads(manifest.read_text())
    doc["meta"]["pad"] = "x" * MAX_MANIFEST_BYTES
    manifest.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="potluck.model.checkpoint"):
        assert latest_complete(tmp_path).step == 1
    assert "not valid JSON" in caplog.text and "larger than" in caplog.text
    with pytest.raises(CheckpointError, match="larger than"):
        load_stage(CheckpointRef(tmp_path, 2, 2), 0)


def test_a_step_written_again_under_another_cut_retracts_the_old_cut(tmp_path):
    """A rollback re-trains step 2 under a 3-stage plan: the 2-stage plan's stage 0 of step 2 must not
    be mixed with it (it is retracted), so the step is incomplete, never inconsistent."""
    save_all(tmp_path, 1, 2)
    save_stage(tmp_path, tensors_for(0, 2), meta_for(2, 0, 2))
    save_stage(tmp_path, tensors_for(1, 2), meta_for(2, 1, 3))
    assert not (tmp_path / "step-00000002" / "stage-000.json").exists()
    with pytest.raises(CheckpointError, match="missing"):
        check_step(tmp_path / "step-00000002")
    assert latest_complete(tmp_path).step == 1


def test_manifests_must_agree_on_stage_count(tmp_path):
    save_all(tmp_path, 1, 2)
    save_all(tmp_path, 2, 2)
    other = tmp_path / "other"
    save_stage(other, tensors_for(1, 2), meta_for(2, 1, 3))  # a foreign stage copied in by hand
    for suffix in ("json", "safetensors"):
        name = f"stage-001.{suffix}"
        (tmp_path / "step-00000002" / name).write_bytes((other / "step-00000002" / name).read_bytes())
    with pytest.raises(CheckpointError, match="disagree"):
        check_step(tmp_path / "step-00000002")
    assert latest_complete(tmp_path).step == 1


def test_bad_arguments_are_rejected(tmp_path):
    ok = {"w": torch.zeros(2)}
    # The meta says which step and stage is written: a bad one fails as it is made (ValueError).
    with pytest.raises(ValueError, match="step"):
        save_stage(tmp_path, ok, meta_for(-1, 0, 1))
    with pytest.raises(ValueError, match="outside"):
        save_stage(tmp_path, ok, meta_for(0, 2, 2))
    with pytest.raises(ValueError, match="outside"):
        save_stage(tmp_path, ok, meta_for(0, -1, 2))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        save_stage(tmp_path, {"w": [1.0, 2.0]}, meta_for(0, 0, 1))  # type: ignore[dict-item]
    # What the untyped meta let through: values JSON cannot hold, NaN, unbounded sizes, loose dicts.
    with pytest.raises(ValueError, match="x"):
        save_stage(tmp_path, ok, meta_for(0, 0, 1, x=object()))
    with pytest.raises(ValueError, match="seed"):
        save_stage(tmp_path, ok, meta_for(0, 0, 1, seed=float("nan")))
    with pytest.raises(ValueError, match="tokenizer"):
        save_stage(tmp_path, ok, meta_for(0, 0, 1, tokenizer="x" * MAX_MANIFEST_BYTES))
    with pytest.raises(TypeError, match="StageMeta"):
        save_stage(tmp_path, ok, {"step": 0, "stage": 0, "n_stages": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep"):
        prune(tmp_path, 0)
    assert not any(tmp_path.iterdir())  # nothing was written by a rejected call
    assert issubclass(CheckpointError, ProtocolError)


def test_rejected_meta_does_not_retract_a_saved_stage(tmp_path):
    save_all(tmp_path, 1, 1)
    with pytest.raises(TypeError):  # a loose dict is no StageMeta: refused before the disk is touched
        save_stage(tmp_path, {"w": torch.ones(1)}, {"step": 1, "stage": 0, "bad": {1, 2}})  # type: ignore[arg-type]
    assert latest_complete(tmp_path).step == 1


def test_prune_keeps_newest_complete(tmp_path):
    save_stage(tmp_path, tensors_for(0, 0), meta_for(0, 0, 2))  # incomplete, old
    for step in (1, 2, 3, 5):
        save_all(tmp_path, step, 2)
    # incomplete, newest: maybe still being written
    save_stage(tmp_path, tensors_for(0, 6), meta_for(6, 0, 2))
    (tmp_path / "step-00000005" / "stage-000.safetensors").write_bytes(b"rot")  # damaged: not complete
    removed = prune(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["step-00000000", "step-00000001"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["step-00000002", "step-00000003", "step-00000005", "step-00000006"]
    assert latest_complete(tmp_path).step == 3
    assert prune(tmp_path, keep=2) == []
    assert prune(tmp_path / "nowhere", keep=1) == []


def test_concurrent_stage_writes_make_a_complete_checkpoint(tmp_path):
    n_stages = 6
    barrier = threading.Barrier(n_stages)
    errors: list[BaseException] = []

    def write(stage: int) -> None:
        try:
            barrier.wait(timeout=10)
            save_stage(tmp_path, tensors_for(stage, 7), meta_for(7, stage, n_stages))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write, args=(j,)) for j in range(n_stages)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    ref = latest_complete(tmp_path)
    assert ref == CheckpointRef(tmp_path, 7, n_stages)
    for j in range(n_stages):
        tensors, meta = load_stage(ref, j)
        assert meta == meta_for(7, j, n_stages)
        assert torch.equal(tensors["model.w"], tensors_for(j, 7)["model.w"])


def test_empty_or_missing_root_has_no_checkpoint(tmp_path):
    assert latest_complete(tmp_path) is None
    assert latest_complete(tmp_path / "missing") is None
    (tmp_path / "step-00000001").mkdir()
    assert latest_complete(tmp_path) is None


def test_stage_meta_round_trips_and_names_every_bad_field(tmp_path):
    meta = meta_for(3, 1, 2, tokenizer="t.json")
    assert StageMeta.from_dict(meta.to_dict(), "here") == meta
    raw = meta.to_dict()
    cases = {
        "meta lacks ['epoch']": {k: v for k, v in raw.items() if k != "epoch"},
        "meta field `pad`": {**raw, "pad": 1},
        "meta field `step`": {**raw, "step": "3"},  # strings are not coerced
        "meta field `seed`": {**raw, "seed": True},  # nor booleans
        "meta field `model.n_layers`": {**raw, "model": {**raw["model"], "n_layers": 8.0}},  # nor floats
        "meta field `tokenizer`": {**raw, "tokenizer": 3},
        "outside": {**raw, "last_layer": 9},  # beyond the model's 8 layers
    }
    for expected, bad in cases.items():
        with pytest.raises(CheckpointError, match=expected.replace("[", r"\[").replace("]", r"\]")) as err:
            StageMeta.from_dict(bad, "here")
        assert str(err.value).startswith("here: ")
    with pytest.raises(CheckpointError, match="not an object"):
        StageMeta.from_dict([1], "here")
    with pytest.raises(ValueError):  # frozen
        meta.step = 4  # type: ignore[misc]


@pytest.mark.parametrize("change", ["drop", "disagree"])
def test_a_manifest_with_bad_or_disagreeing_meta_is_damage(tmp_path, caplog, change):
    save_all(tmp_path, 1, 2)
    save_all(tmp_path, 2, 2)
    manifest = tmp_path / "step-00000002" / "stage-001.json"
    doc = json.loads(manifest.read_text())
    if change == "drop":
        del doc["meta"]["model"]
    else:
        doc["meta"]["step"] = 1  # the manifest says step 2
    manifest.write_text(json.dumps(doc))
    expected = "meta lacks" if change == "drop" else "meta says step 1"
    with caplog.at_level(logging.WARNING, logger="potluck.model.checkpoint"):
        assert latest_complete(tmp_path).step == 1
    assert expected in caplog.text
    with pytest.raises(CheckpointError, match=expected):
        load_stage(CheckpointRef(tmp_path, 2, 2), 1)
