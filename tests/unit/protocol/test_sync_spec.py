"""The job's [sync] section: parsing, defaults, bounds, and the rule against DiLoCo."""

import pytest

from potluck.protocol.errors import JobSpecError
from potluck.protocol.jobfile import load_job

BASE = (
    'name = "x"\n[model]\nn_layers = 2\nd_model = 64\nn_heads = 4\nvocab_size = 256\nseq_len = 16\n'
    "[batch]\ntokens_per_step = 64\nmicro_batch_size = 2\n"
)


def job(tmp_path, extra: str):
    f = tmp_path / "job.toml"
    f.write_text(BASE + extra)
    return load_job(f)


def test_default_is_strict(tmp_path):
    sync = job(tmp_path, "").sync
    assert sync.policy == "strict"
    assert sync.deadline_factor > 0 and sync.min_deadline_s >= 0 and sync.max_misses >= 1


def test_deadline_section_parses(tmp_path):
    text = '[sync]\npolicy = "deadline"\ndeadline_factor = 2.5\nmin_deadline_s = 0.25\nmax_misses = 40\n'
    sync = job(tmp_path, text).sync
    assert (sync.policy, sync.deadline_factor, sync.min_deadline_s, sync.max_misses) == (
        "deadline",
        2.5,
        0.25,
        40,
    )


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('policy = "fastest"', "sync.policy"),
        ("deadline_factor = 0", "sync.deadline_factor"),
        ("min_deadline_s = -1", "sync.min_deadline_s"),
        ("max_misses = 0", "sync.max_misses"),
        ("colour = 1", "sync.colour"),
    ],
)
def test_bad_values_name_the_field(tmp_path, text, field):
    with pytest.raises(JobSpecError, match=f"field `{field}`"):
        job(tmp_path, f"[sync]\n{text}\n")


def test_deadline_with_dense_local_steps_is_rejected_and_with_the_coded_sync_taken(tmp_path):
    with pytest.raises(JobSpecError, match=r"sync_every = 4\) needs compression\.outer"):
        job(tmp_path, '[sync]\npolicy = "deadline"\n[compression]\nsync_every = 4\n')
    # the coded outer sync has a deadline of its own (peer/collectives/partial.py)
    coded = job(tmp_path, '[sync]\npolicy = "deadline"\n[compression]\nsync_every = 4\nouter = "int2"\n')
    assert coded.sync.policy == "deadline" and coded.compression.outer == "int2"
    assert (
        job(tmp_path, '[sync]\npolicy = "strict"\n[compression]\nsync_every = 4\n').compression.sync_every
        == 4
    )
