"""A job ``from`` a Hugging Face directory: its shape from config.json, one clear error per thing
potluck cannot run, and a native job's signed record unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from potluck.model.errors import HubError
from potluck.model.hub.config import expand_model, spec_fields
from potluck.model.hub.config import load_job_file as load
from potluck.protocol.errors import JobSpecError
from potluck.protocol.jobspec import JobSpec, ModelSpec
from tests.helpers.hfmodels import LLAMA, transformers
from tests.unit.model.hub.test_weights import job_file


def config(**change: Any) -> dict[str, Any]:
    """A Llama config.json as transformers 5 writes it, with ``change`` applied."""
    data = json.loads(transformers.LlamaConfig(**LLAMA).to_json_string())
    return data | change


def write(tmp: Path, data: dict[str, Any]) -> Path:
    (tmp / "m").mkdir(exist_ok=True)
    (tmp / "m" / "config.json").write_text(json.dumps(data))
    return tmp / "m"


def test_the_shape_comes_from_config_json(tmp_path: Path) -> None:
    write(tmp_path, config())
    job = load(job_file(tmp_path, "m"))
    m = job.model
    assert (m.n_layers, m.d_model, m.n_heads, m.kv_heads, m.ffn_hidden, m.vocab_size) == (3, 64, 8, 2, 80, 96)
    assert (m.rope_theta, m.norm_eps, m.family, m.max_positions, m.pretrained) == (
        5e5,
        1e-5,
        "llama",
        64,
        True,
    )
    assert m.rope_scaling is not None and m.rope_scaling.original_max_positions == 16
    # the signed record names the directory as the job file does, and reads back equal
    record = job.model_dump(mode="json")
    assert record["model"]["from"] == "m" and JobSpec.model_validate(record) == job
    # a job may repeat a field that agrees, and say init = "random" to take the architecture only
    assert load(job_file(tmp_path, "m", "n_layers = 3", 'init = "random"')).model.pretrained is False


def test_the_older_rotary_spelling_is_read() -> None:
    old = config(rope_theta=250000.0, rope_parameters=None)
    old["rope_scaling"] = {"type": "llama3"} | {
        k: v for k, v in LLAMA["rope_scaling"].items() if k != "rope_type"
    }
    fields = spec_fields(old)
    assert fields["rope_theta"] == 250000.0 and fields["rope_scaling"].factor == 8.0
    plain = spec_fields(config(rope_parameters=None, rope_theta=10000.0))
    assert plain["rope_scaling"] is None


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"model_type": "gpt2"}, r"model_type 'gpt2' is not supported \(supported: llama, qwen2, mistral\)"),
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"head_dim": 16}, "head_dim 16"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "rope type 'yarn'"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"num_hidden_layers": None}, "not a number"),
    ],
)
def test_what_potluck_cannot_run_is_refused_by_name(
    tmp_path: Path, change: dict[str, Any], error: str
) -> None:
    write(tmp_path, config(**change))
    with pytest.raises(JobSpecError, match=error):
        load(job_file(tmp_path, "m"))


def test_a_sliding_window_shorter_than_the_sequence_is_refused(tmp_path: Path) -> None:
    write(tmp_path, config(model_type="mistral", sliding_window=16))
    with pytest.raises(JobSpecError, match="sliding window of 16"):
        load(job_file(tmp_path, "m"))
    write(tmp_path, config(model_type="mistral", sliding_window=4096))
    assert load(job_file(tmp_path, "m")).model.family == "mistral"


def test_a_field_that_disagrees_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, config())
    with pytest.raises(JobSpecError, match=r"model\.n_layers = 4 disagrees"):
        load(job_file(tmp_path, "m", "n_layers = 4"))
    with pytest.raises(JobSpecError, match="max_position_embeddings"):
        longer(tmp_path, seq_len=128)  # the model knows 64 positions


def longer(tmp: Path, seq_len: int) -> JobSpec:
    """The job of ``job_file`` with another ``seq_len`` (and a batch of one sequence)."""
    path = job_file(tmp, "m")
    path.write_text(
        path.read_text()
        .replace("seq_len = 32", f"seq_len = {seq_len}")
        .replace("tokens_per_step = 64", f"tokens_per_step = {seq_len}")
    )
    return load(path)


def test_a_missing_directory_or_config_is_named(tmp_path: Path) -> None:
    with pytest.raises(JobSpecError, match="cannot read the model's config"):
        load(job_file(tmp_path, "nowhere"))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("[1, 2]")
    with pytest.raises(JobSpecError, match="not a JSON object"):
        load(job_file(tmp_path, "m"))
    with pytest.raises(HubError, match="path to a Hugging Face model directory"):
        expand_model({"from": 3}, tmp_path)


def test_a_native_job_signs_what_it_signed_before() -> None:
    spec = ModelSpec(n_layers=2, d_model=64, n_heads=4, vocab_size=100, seq_len=16)
    assert spec.model_dump(mode="json") == {
        "n_layers": 2,
        "d_model": 64,
        "n_heads": 4,
        "vocab_size": 100,
        "seq_len": 16,
    }
    with pytest.raises(ValueError, match="init = 'pretrained' needs `from`"):
        ModelSpec(n_layers=2, d_model=64, n_heads=4, vocab_size=100, seq_len=16, init="pretrained")
    with pytest.raises(ValueError, match="must divide n_heads"):
        ModelSpec(n_layers=2, d_model=64, n_heads=4, vocab_size=100, seq_len=16, n_kv_heads=3)
