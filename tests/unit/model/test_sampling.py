"""Sampling from a stage checkpoint: loading the chain, greedy and seeded generation, ``potluck generate``."""

import json

import pytest
import torch
from typer.testing import CliRunner

from potluck.cli import app
from potluck.model.checkpoint import CheckpointRef, latest_complete, save_stage
from potluck.model.data import ByteTokenizer
from potluck.model.errors import DataError
from potluck.model.sampling import checkpoint_tokenizer_file, generate, load_model
from potluck.model.transformer import StageModel
from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.errors import CheckpointError
from potluck.protocol.jobspec import ModelSpec

SPEC = ModelSpec(n_layers=3, d_model=32, n_heads=2, vocab_size=256, seq_len=16)
SPLIT = [(0, 2), (2, 3)]
SEED = 7
runner = CliRunner()


def trained_stages() -> list[StageModel]:
    """Stages whose weights differ from a fresh init, so a test passes only if loading really loads."""
    gen = torch.Generator().manual_seed(123)
    stages = [StageModel(SPEC, a, b, seed=SEED) for a, b in SPLIT]
    with torch.no_grad():
        for s in stages:
            for p in s.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return stages


def write_checkpoint(root, step: int = 40, tokenizer: str | None = None, **meta_override) -> list[StageModel]:
    stages = trained_stages()
    for j, s in enumerate(stages):
        tensors = {f"model.{k}": v for k, v in s.state_dict().items()}
        tensors["optim.step"] = torch.tensor(step)  # other prefixes ride along and are ignored
        meta = {
            "job": "tiny",
            "step": step,
            "stage": j,
            "n_stages": len(stages),
            "first_layer": s.first,
            "last_layer": s.last,
            "model": SPEC,
            "seed": SEED,
            "tokenizer": tokenizer,
            "epoch": 1,
        }
        meta.update(meta_override.get(f"stage{j}", {}))
        save_stage(root, tensors, StageMeta(**meta))
    return stages


def whole_model(stages: list[StageModel]) -> StageModel:
    """One StageModel over all layers holding the same weights as ``stages``."""
    whole = StageModel(SPEC, 0, SPEC.n_layers, seed=SEED + 1)
    state = {}
    for s in stages:
        for k, v in s.state_dict().items():
            if k.startswith("layers."):
                _, i, rest = k.split(".", 2)
                k = f"layers.{s.first + int(i)}.{rest}"
            state[k] = v
    whole.load_state_dict(state, strict=True)
    return whole.eval()


def test_loaded_chain_equals_the_whole_model(tmp_path):
    original = write_checkpoint(tmp_path)
    ref = latest_complete(tmp_path)
    stages, spec, meta = load_model(ref)
    assert spec == SPEC and meta.job == "tiny" and meta.stage == 0 and len(stages) == 2
    assert all(not s.training for s in stages)
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        h = x
        for s in stages:
            h = s(h)
        expected = whole_model(original)(x)
        fresh = StageModel(SPEC, 0, SPEC.n_layers, seed=SEED)(x)
    torch.testing.assert_close(h, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(h, fresh, atol=1e-3)  # the trained weights were loaded, not re-initialised


def manual_greedy(model: StageModel, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids[-SPEC.seq_len :]]))
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_greedy_is_deterministic_and_matches_argmax(tmp_path):
    original = write_checkpoint(tmp_path)
    stages, _, _ = load_model(latest_complete(tmp_path))
    prompt = ByteTokenizer().encode("ada adds 1")  # 10 tokens + 20 new > seq_len 16: the context is cropped
    out = generate(stages, prompt, 20, temperature=0.0, top_k=None, seed=0)
    assert len(out) == 20
    assert out == generate(stages, prompt, 20, temperature=0.0, top_k=None, seed=5)
    assert out == manual_greedy(whole_model(original), prompt, 20)
    assert generate(stages, prompt, 20, temperature=1.0, top_k=1, seed=3) == out  # top-1 is greedy
    assert generate(stages, prompt, 0, temperature=0.0, top_k=None, seed=0) == []


def test_sampling_is_seeded(tmp_path):
    write_checkpoint(tmp_path)
    stages, _, _ = load_model(latest_complete(tmp_path))
    prompt = [65, 66, 67]
    a = generate(stages, prompt, 30, temperature=2.0, top_k=None, seed=1)
    assert a == generate(stages, prompt, 30, temperature=2.0, top_k=None, seed=1)
    assert a != generate(stages, prompt, 30, temperature=2.0, top_k=None, seed=2)
    assert all(0 <= t < SPEC.vocab_size for t in a)


def test_generate_rejects_bad_input(tmp_path):
    write_checkpoint(tmp_path)
    stages, _, _ = load_model(latest_complete(tmp_path))
    with pytest.raises(ValueError, match="empty"):
        generate(stages, [], 5, 0.0, None, 0)
    with pytest.raises(ValueError, match="token ids"):
        generate(stages, [256], 5, 0.0, None, 0)
    with pytest.raises(ValueError, match="temperature"):
        generate(stages, [1], 5, -1.0, None, 0)
    with pytest.raises(ValueError, match="top_k"):
        generate(stages, [1], 5, 1.0, 0, 0)
    with pytest.raises(ValueError, match="embedding"):
        generate(stages[1:], [1], 5, 0.0, None, 0)


def test_inconsistent_checkpoints_are_refused(tmp_path):
    write_checkpoint(tmp_path / "a", stage1={"seed": SEED + 1})
    with pytest.raises(CheckpointError, match="disagrees"):
        load_model(CheckpointRef(tmp_path / "a", 40, 2))
    write_checkpoint(tmp_path / "b", stage1={"first_layer": 1})
    with pytest.raises(CheckpointError, match="layers"):
        load_model(CheckpointRef(tmp_path / "b", 40, 2))
    write_checkpoint(tmp_path / "c")
    manifest = tmp_path / "c" / "step-00000040" / "stage-000.json"
    doc = json.loads(manifest.read_text())
    doc["meta"] = {"job": "x"}  # what an untyped writer could leave
    manifest.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="meta lacks"):
        load_model(CheckpointRef(tmp_path / "c", 40, 2))


def test_cli_prints_prompt_and_continuation(tmp_path):
    original = write_checkpoint(tmp_path)
    args = ["--prompt", "ada adds", "--max-tokens", "12", "--temperature", "0"]
    result = runner.invoke(app, ["generate", str(tmp_path), *args])
    assert result.exit_code == 0, result.output
    prompt = ByteTokenizer().encode("ada adds")
    expected = ByteTokenizer().decode(prompt + manual_greedy(whole_model(original), prompt, 12))
    assert result.stdout == expected + "\n"
    by_step = runner.invoke(app, ["generate", str(tmp_path / "step-00000040"), *args])
    assert by_step.exit_code == 0 and by_step.stdout == result.stdout
    sampled = runner.invoke(app, ["generate", str(tmp_path), "-p", "ada", "--max-tokens", "5", "--seed", "3"])
    assert sampled.exit_code == 0 and sampled.stdout.startswith("ada")


def test_cli_errors_are_one_line_and_exit_2(tmp_path):
    result = runner.invoke(app, ["generate", str(tmp_path / "nowhere"), "--prompt", "hi"])
    assert result.exit_code == 2 and "does not exist" in result.output
    result = runner.invoke(app, ["generate", str(tmp_path), "--prompt", "hi"])
    assert result.exit_code == 2 and "no complete checkpoint" in result.output
    write_checkpoint(tmp_path / "damaged")
    weights = tmp_path / "damaged" / "step-00000040" / "stage-001.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    result = runner.invoke(app, ["generate", str(weights.parent), "--prompt", "hi"])
    assert result.exit_code == 2 and "sha256" in result.output
    write_checkpoint(tmp_path / "tok", tokenizer=str(tmp_path / "missing-tokenizer.json"))
    result = runner.invoke(app, ["generate", str(tmp_path / "tok"), "--prompt", "hi"])
    assert result.exit_code == 2 and "missing-tokenizer.json" in result.output
    result = runner.invoke(app, ["generate", str(tmp_path / "tok"), "--prompt", "hi", "--max-tokens", "-1"])
    assert result.exit_code == 2


def test_help_lists_generate():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0 and "generate" in result.output


def test_the_jobs_tokenizer_is_found_beside_the_checkpoints_or_named(tmp_path, monkeypatch):
    spec = ModelSpec(n_layers=1, d_model=16, n_heads=2, vocab_size=300, seq_len=8)
    meta = StageMeta(
        job="t", step=1, stage=0, n_stages=1, first_layer=0, last_layer=1, model=spec, seed=0,
        tokenizer="data/tok.json", epoch=1,
    )  # fmt: skip
    monkeypatch.chdir(tmp_path)  # "data/tok.json" from here: nothing
    with pytest.raises(DataError, match="pass --tokenizer FILE"):
        checkpoint_tokenizer_file(meta, tmp_path / "ckpt")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "tokenizer.json").write_text("{}")
    assert checkpoint_tokenizer_file(meta, tmp_path / "ckpt") == tmp_path / "ckpt" / "tokenizer.json"
    assert checkpoint_tokenizer_file(meta, tmp_path / "ckpt", tmp_path / "x.json") == tmp_path / "x.json"
    assert checkpoint_tokenizer_file(meta.model_copy(update={"tokenizer": None}), tmp_path) is None
