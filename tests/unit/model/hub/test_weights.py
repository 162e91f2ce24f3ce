"""A Hugging Face checkpoint in potluck's stages and back: the same function, the same bits."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from potluck.model.errors import HubError
from potluck.model.hub.config import hf_config, load_job_file
from potluck.model.hub.convert import export_checkpoint, hf_tensors, pretrained_checkpoint
from potluck.model.hub.names import stage_shapes
from potluck.model.hub.read import stage_weights, weights_digest
from potluck.model.transformer import StageModel
from potluck.protocol.checkpoints import check_step, step_dir
from potluck.protocol.jobspec import JobSpec, ModelSpec
from tests.helpers.hfmodels import make_model, transformers

SEQ = 32


def job_file(tmp: Path, source: str, *extra: str) -> Path:
    path = tmp / "job.toml"
    lines = ['name = "hf"', "[model]", f'from = "{source}"', f"seq_len = {SEQ}", *extra]
    lines += ["[batch]", f"tokens_per_step = {SEQ * 2}", "micro_batch_size = 1"]
    path.write_text("\n".join(lines) + "\n")
    return path


def chain_logits(spec: ModelSpec, directory: Path, cuts: list[int], ids: torch.Tensor) -> torch.Tensor:
    """The logits of potluck stages [cuts[i], cuts[i + 1]), each loaded from ``directory`` alone."""
    h = ids
    for first, last in itertools.pairwise(cuts):
        stage = StageModel(spec, first, last, seed=0)
        stage.load_state_dict(stage_weights(directory, spec, first, last), strict=True)
        with torch.no_grad():
            h = stage.eval()(h)
    return h


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_a_stage_chain_computes_what_transformers_computes(tmp_path: Path, kind: str) -> None:
    model = make_model(kind, tmp_path / kind)
    spec = load_job_file(job_file(tmp_path, kind)).model
    ids = torch.randint(0, spec.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
    for cuts in ([0, spec.n_layers], [0, 1, spec.n_layers]):
        got = chain_logits(spec, tmp_path / kind, cuts, ids)
        assert (got - want).abs().max().item() < 1e-5, (kind, cuts)


def test_stage_shapes_are_the_transformers_own(llama: tuple[Path, Any]) -> None:
    spec = load_job_file(job_file(llama[0].parent, "llama")).model
    for first, last in [(0, 1), (1, 3), (0, 3)]:
        model = StageModel(spec, first, last, seed=0)
        assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == stage_shapes(spec, first, last)


def test_a_sharded_checkpoint_is_read_tensor_by_tensor(tmp_path: Path) -> None:
    model = make_model("llama", tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    spec = load_job_file(job_file(tmp_path, "sharded")).model
    ids = torch.randint(0, spec.vocab_size, (1, SEQ))
    with torch.no_grad():
        want = model(ids).logits
    assert (chain_logits(spec, tmp_path / "sharded", [0, 2, 3], ids) - want).abs().max().item() < 1e-5


def test_bf16_weights_are_widened_exactly(tmp_path: Path) -> None:
    model = make_model("llama", tmp_path / "fp32").to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16")
    spec = load_job_file(job_file(tmp_path, "bf16")).model
    got = stage_weights(tmp_path / "bf16", spec, 0, 1)
    assert got["embed.weight"].dtype == torch.float32
    assert torch.equal(got["embed.weight"], model.model.embed_tokens.weight.float())


def test_a_missing_or_misshapen_tensor_is_named(llama: tuple[Path, Any], tmp_path: Path) -> None:
    spec = load_job_file(job_file(tmp_path, "llama")).model
    tensors = load_file(str(llama[0] / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(llama[0] / "model.safetensors"))
    with pytest.raises(HubError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        stage_weights(llama[0], spec, 1, 2)
    wrong = spec.model_copy(update={"ffn_width": 64})
    with pytest.raises(HubError, match="shape"):
        stage_weights(llama[0], wrong, 0, 1)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_import_then_export_is_bit_identical(tmp_path: Path, kind: str) -> None:
    model = make_model(kind, tmp_path / kind)
    job = load_job_file(job_file(tmp_path, kind))
    written = pretrained_checkpoint(job, tmp_path / kind, tmp_path / "ckpt")
    assert written == step_dir(tmp_path / "ckpt", 0)
    assert pretrained_checkpoint(job, tmp_path / kind, tmp_path / "ckpt") is None  # a relaunch
    done = export_checkpoint(check_step(written), tmp_path / "out")
    assert done.tied == (kind == "qwen2")
    with (
        safe_open(str(tmp_path / kind / "model.safetensors"), "pt") as a,
        safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as b,
    ):
        assert set(a.keys()) == set(b.keys())
        for name in a.keys():  # noqa: SIM118 (a handle)
            assert torch.equal(a.get_tensor(name), b.get_tensor(name)), name
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == kind and config["tie_word_embeddings"] == (kind == "qwen2")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(0, job.model.vocab_size, (1, SEQ))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_a_trained_tied_head_is_exported_untied(qwen2: tuple[Path, Any], tmp_path: Path) -> None:
    """Across stages potluck trains the head apart from the embedding: once they differ, the export
    says so (tie_word_embeddings false, lm_head written) rather than dropping the head."""
    spec = load_job_file(job_file(tmp_path, "qwen2")).model
    weights = stage_weights(qwen2[0], spec, 0, spec.n_layers)
    weights["head.weight"] = weights["head.weight"] + 1e-3
    tensors, tied = hf_tensors(spec, weights)
    assert not tied and torch.equal(tensors["lm_head.weight"], weights["head.weight"])


def test_a_native_model_exports_as_llama(tmp_path: Path) -> None:
    spec = ModelSpec(n_layers=2, d_model=32, n_heads=4, vocab_size=64, seq_len=16)
    job = JobSpec(name="native", model=spec, batch={"tokens_per_step": 32, "micro_batch_size": 1})
    model = StageModel(spec, 0, 2, seed=3)
    tensors, tied = hf_tensors(spec, model.state_dict())
    assert not tied and "lm_head.weight" in tensors
    (tmp_path / "n").mkdir()
    save_file(tensors, str(tmp_path / "n" / "model.safetensors"))
    (tmp_path / "n" / "config.json").write_text(json.dumps(hf_config(job.model, tied)))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "n").eval()
    ids = torch.randint(0, 64, (1, 16))
    with torch.no_grad():
        assert (loaded(ids).logits - model.eval()(ids)).abs().max().item() < 1e-5


def test_a_model_with_bottleneck_maps_is_not_exported() -> None:
    spec = ModelSpec(n_layers=2, d_model=32, n_heads=4, vocab_size=64, seq_len=16, bottleneck_rank=8)
    model = StageModel(spec, 0, 2, seed=0, cuts=[1])
    with pytest.raises(HubError, match="bottleneck"):
        hf_tensors(spec, model.state_dict())


def test_step_zero_is_one_stage_a_layer_and_follows_the_weights(tmp_path: Path) -> None:
    make_model("llama", tmp_path / "m")
    job = load_job_file(job_file(tmp_path, "m"))
    digest = weights_digest(tmp_path / "m")
    job = job.model_copy(update={"model": job.model.model_copy(update={"weights_sha256": digest})})
    written = pretrained_checkpoint(job, tmp_path / "m", tmp_path / "ckpt")
    assert written is not None and check_step(written).n_stages == job.model.n_layers
    assert pretrained_checkpoint(job, tmp_path / "m", tmp_path / "ckpt") is None
    make_model("llama", tmp_path / "m", seed=1)  # the owner replaced the weights
    assert weights_digest(tmp_path / "m") != digest
    changed = job.model.model_copy(update={"weights_sha256": weights_digest(tmp_path / "m")})
    assert pretrained_checkpoint(job.model_copy(update={"model": changed}), tmp_path / "m", tmp_path / "ckpt")


def test_a_relaunch_reuses_the_weights_hashes_it_kept_and_sees_a_changed_file(tmp_path: Path) -> None:
    make_model("llama", tmp_path / "m")
    memo = tmp_path / "ckpt" / "weights-sha256.json"
    digest = weights_digest(tmp_path / "m", memo)
    assert memo.is_file() and weights_digest(tmp_path / "m") == digest  # the memo changes nothing
    assert weights_digest(tmp_path / "m", memo) == digest
    make_model("llama", tmp_path / "m", seed=1)  # new bytes, a new modification time
    assert weights_digest(tmp_path / "m", memo) != digest
