from pathlib import Path

import pytest

from potluck.protocol.errors import JobSpecError
from potluck.protocol.jobspec import DataSpec, ModelSpec, load_job

ROOT = Path(__file__).resolve().parents[3]


def test_example_job_loads():
    job = load_job(ROOT / "examples" / "tiny.toml")
    assert job.name == "tiny" and job.model.n_layers == 4 and job.batch.micro_batch_size == 8
    assert job.model.n_params > 0


def test_home_uplinks_example_has_the_measured_whole_job_settings():
    """examples/home-uplinks.toml is the configuration docs/benchmarks.md measured (issue 22)."""
    job = load_job(ROOT / "examples" / "home-uplinks.toml")
    assert (job.model.bottleneck_rank, job.model.bottleneck_tokens) == (16, True)
    c = job.compression
    assert (c.activations, c.outer, c.sync_every) == ("int4:block=64|zstd", "int2:block=64|zstd", 24)
    assert (c.outer_lr, c.outer_momentum, job.sync.policy) == (0.8, 0.0, "deadline")
    assert job.sequences_per_step == 32 and job.model.seq_len == 64  # the bench's demo batch


def test_errors_name_the_field(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text(
        'name = "x"\ncolour = 1\n[model]\nn_layers = 0\nd_model = 64\nn_heads = 5\nvocab_size = 256\n'
        "seq_len = 32\n[batch]\ntokens_per_step = 1\nmicro_batch_size = 1\n"
    )
    with pytest.raises(JobSpecError) as err:
        load_job(f)
    text = str(err.value)
    assert "field `model.n_layers`" in text
    assert "field `model.n_heads`" in text and "even head width" in text
    assert "field `colour`" in text


def test_unreadable_and_invalid_toml(tmp_path):
    with pytest.raises(JobSpecError, match="cannot read job file"):
        load_job(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(JobSpecError, match="not valid TOML"):
        load_job(bad)
    missing = tmp_path / "m.toml"
    missing.write_text('name = "x"\n')
    with pytest.raises(JobSpecError, match="field `model`: Field required"):
        load_job(missing)


BASE = (
    'name = "x"\n[model]\nn_layers = 2\nd_model = 64\nn_heads = 4\nvocab_size = 256\nseq_len = 32\n'
    "[batch]\ntokens_per_step = 256\nmicro_batch_size = 2\n"
)


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ('[data]\nsource = "directory"\n', "data", "needs `path`"),
        ('[data]\nsource = "web"\n', "data.source", "generated"),
        ("[optimizer]\nlr = -1\n", "optimizer.lr", "greater than 0"),
        ("[optimizer]\nbeta2 = 1.0\n", "optimizer.beta2", "less than 1"),
        ("[compression]\nsync_every = 0\n", "compression.sync_every", "greater than or equal to 1"),
        ("[checkpoint]\ninterval = 0\n", "checkpoint.interval", "greater than or equal to 1"),
        ("[limits]\nstages = 3\n", "(top level)", "limits.stages (3) exceeds model.n_layers"),
        ("[optimizer]\nmomentum = 0.9\n", "optimizer.momentum", "Extra inputs"),
    ],
)
def test_section_errors_name_the_field(tmp_path, extra, field, words):
    f = tmp_path / "job.toml"
    f.write_text(BASE + extra)
    with pytest.raises(JobSpecError) as err:
        load_job(f)
    assert f"field `{field}`" in str(err.value) and words in str(err.value)


def test_batch_must_hold_whole_sequences(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text(BASE.replace("tokens_per_step = 256", "tokens_per_step = 100"))
    with pytest.raises(JobSpecError, match=r"batch.tokens_per_step \(100\) must be a multiple of"):
        load_job(f)


def test_defaults_fill_the_optional_sections(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text(BASE)
    job = load_job(f)
    assert job.data.source == "generated" and job.optimizer.clip_norm == 1.0
    assert job.compression.sync_every == 1 and job.checkpoint.interval >= 1
    assert job.sequences_per_step == 8


@pytest.mark.parametrize("d_model", [8, 64, 96, 1000, 4096])
def test_model_spec_owns_the_shape_arithmetic(d_model):
    spec = ModelSpec(n_layers=3, d_model=d_model, n_heads=2, vocab_size=500, seq_len=128)
    hidden = spec.ffn_hidden  # SwiGLU: about 8/3 d, rounded up to a multiple of 64
    assert hidden % 64 == 0 and 8 * d_model / 3 <= hidden < 8 * d_model / 3 + 64
    assert spec.params_per_layer == 4 * d_model**2 + 3 * d_model * hidden + 2 * d_model
    assert spec.n_params == 3 * spec.params_per_layer + 2 * 500 * d_model + d_model
    assert spec.flops_per_token == 3 * spec.layer_flops_per_token + 2 * spec.embed_params


def test_the_data_section_signs_as_before_and_refuses_what_cannot_be_read(tmp_path):
    assert DataSpec().model_dump(mode="json") == {
        "source": "generated",
        "path": None,
        "generated_chars": 1_000_000,
        "tokenizer": None,
    }  # the shipping fields are left out at their defaults: older releases signed without them
    shipped = DataSpec(source="directory", path="corpus", fingerprint="ab" * 32, shard_tokens=2048)
    assert DataSpec.model_validate(shipped.model_dump(mode="json")) == shipped
    with pytest.raises(ValueError, match="only with source = 'directory'"):
        DataSpec(path="corpus")
    with pytest.raises(ValueError, match="needs source = 'directory'"):
        DataSpec(fingerprint="ab" * 32)
    with pytest.raises(ValueError, match="pattern"):
        DataSpec(source="directory", path="corpus", fingerprint="not a hash")
