from pathlib import Path

import pytest

from potluck.protocol.errors import JobSpecError
from potluck.protocol.jobfile import load_job

ROOT = Path(__file__).resolve().parents[3]


def test_example_job_loads():
    job = load_job(ROOT / "examples" / "tiny.toml")
    assert job.name == "tiny" and job.model.n_layers == 4 and job.batch.micro_batch_size == 8
    assert job.model.n_params > 0


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
    assert "field `model.n_heads`" in text and "divisible" in text
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
