"""How replicas synchronise, as a job file says it: the ``[sync]`` section (parsing, defaults, bounds, the
rule against DiLoCo), and ``compression.outer`` / ``compression.outer_ef_decay`` (parsing, the rules naming
the field, and their absence from the signed form at defaults: older peers' signatures and readers
unchanged)."""

import pytest

from potluck.protocol.errors import JobSpecError
from potluck.protocol.jobspec import JobSpec, load_job
from potluck.protocol.records import canonical_json

BASE = (
    'name = "x"\n[model]\nn_layers = 2\nd_model = 64\nn_heads = 4\nvocab_size = 256\nseq_len = 16\n'
    "[batch]\ntokens_per_step = 64\nmicro_batch_size = 2\n"
)


def job(tmp_path, extra: str) -> JobSpec:
    f = tmp_path / "job.toml"
    f.write_text(BASE + extra)
    return load_job(f)


def test_the_outer_codec_parses(tmp_path):
    text = '[compression]\nsync_every = 16\nouter = "int2:block=512|zstd"\nouter_ef_decay = 0.95\n'
    comp = job(tmp_path, text).compression
    assert (comp.sync_every, comp.outer, comp.outer_ef_decay) == (16, "int2:block=512|zstd", 0.95)
    assert job(tmp_path, "").compression.outer is None


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ('[compression]\nouter = "int2"\n', "compression", "needs compression.sync_every > 1"),
        ('[compression]\nsync_every = 1\nouter = "int2"\n', "compression", "got 1"),
        ("[compression]\nsync_every = 4\nouter_ef_decay = 0.5\n", "compression", "outer, which is not set"),
        (
            '[compression]\nsync_every = 4\nouter = "int2"\nouter_ef_decay = 1.5\n',
            "compression.outer_ef_decay",
            "less",
        ),
        ('[compression]\nsync_every = 4\nouter = ""\n', "compression.outer", "at least 1"),
        (
            '[compression]\nsync_every = 4\nouter = "int2"\n[trust]\naggregation = "centered_clip"\n',
            "(top level)",
            "combines by trust.aggregation = 'mean' or 'trimmed_mean'",
        ),
    ],
)
def test_bad_outer_settings_name_the_field(tmp_path, extra, field, words):
    with pytest.raises(JobSpecError) as err:
        job(tmp_path, extra)
    assert f"`{field}" in str(err.value) and words in str(err.value)


def test_an_untrusted_swarm_may_code_its_outer_sync_with_the_trimmed_mean(tmp_path):
    spec = job(
        tmp_path, '[compression]\nsync_every = 4\nouter = "int2"\n[trust]\naggregation = "trimmed_mean"\n'
    )
    assert spec.trust.aggregation == "trimmed_mean" and spec.compression.outer == "int2"


def test_defaults_are_left_out_of_the_signed_form(tmp_path):
    plain = job(tmp_path, "[compression]\nsync_every = 4\n")
    comp = plain.model_dump(mode="json")["compression"]
    assert "outer" not in comp and "outer_ef_decay" not in comp
    # byte for byte what a release without the fields signs: the same record without them
    old = {k: v for k, v in comp.items() if k not in ("outer", "outer_ef_decay")}
    assert canonical_json(comp) == canonical_json(old)
    assert JobSpec.model_validate(plain.model_dump(mode="json")) == plain
    coded = job(tmp_path, '[compression]\nsync_every = 4\nouter = "int2"\n').model_dump(mode="json")
    assert coded["compression"]["outer"] == "int2" and "outer_ef_decay" not in coded["compression"]
    decayed = job(tmp_path, '[compression]\nsync_every = 4\nouter = "int2"\nouter_ef_decay = 0.9\n')
    back = JobSpec.model_validate(decayed.model_dump(mode="json"))
    assert back == decayed and back.canonical_bytes() == decayed.canonical_bytes()


def test_the_outer_step_parses_and_defaults(tmp_path):
    comp = job(tmp_path, "[compression]\nsync_every = 4\nouter_lr = 0.4\nouter_momentum = 0.8\n").compression
    assert (comp.outer_lr, comp.outer_momentum) == (0.4, 0.8)
    plain = job(tmp_path, "").compression
    assert (plain.outer_lr, plain.outer_momentum) == (0.7, 0.9)


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ("[compression]\nsync_every = 4\nouter_lr = 0.0\n", "compression.outer_lr", "greater than 0"),
        ("[compression]\nsync_every = 4\nouter_lr = 10.5\n", "compression.outer_lr", "less than or equal"),
        (
            "[compression]\nsync_every = 4\nouter_momentum = 1.0\n",
            "compression.outer_momentum",
            "less than 1",
        ),
        ("[compression]\nsync_every = 4\nouter_momentum = -0.1\n", "compression.outer_momentum", "greater"),
        (
            '[compression]\nsync_every = 4\nouter = "int2"\nouter_ef_decay = 0.9\nouter_momentum = 0.5\n',
            "compression",
            "outer_momentum cannot be set with compression.outer_ef_decay < 1",
        ),
    ],
)
def test_bad_outer_step_settings_name_the_field(tmp_path, extra, field, words):
    with pytest.raises(JobSpecError) as err:
        job(tmp_path, extra)
    assert f"`{field}" in str(err.value) and words in str(err.value)


def test_the_outer_step_is_left_out_at_defaults(tmp_path):
    plain = job(tmp_path, "[compression]\nsync_every = 4\n")
    spelled = job(tmp_path, "[compression]\nsync_every = 4\nouter_lr = 0.7\nouter_momentum = 0.9\n")
    comp = plain.model_dump(mode="json")["compression"]
    assert "outer_lr" not in comp and "outer_momentum" not in comp
    assert spelled.canonical_bytes() == plain.canonical_bytes()
    tuned = job(tmp_path, "[compression]\nsync_every = 4\nouter_lr = 1.0\nouter_momentum = 0.0\n")
    dumped = tuned.model_dump(mode="json")["compression"]
    assert (dumped["outer_lr"], dumped["outer_momentum"]) == (1.0, 0.0)
    back = JobSpec.model_validate(tuned.model_dump(mode="json"))
    assert back == tuned and back.canonical_bytes() == tuned.canonical_bytes()


# --- the [sync] section ---


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


@pytest.mark.parametrize(
    ("extra", "delay"),
    [
        ("sync_every = 4\n", 1),  # DiLoCo's Nesterov step: lands under one step
        ("sync_every = 4\nouter_momentum = 0.0\nouter_lr = 1.0\n", 3),  # averaging: under H - 1
        ('sync_every = 16\nouter = "int2"\nouter_ef_decay = 0.9\n', 15),  # the residual replaces momentum
        ("sync_every = 4\nouter_delay = 2\n", 2),
        ("sync_every = 4\nouter_delay = 9\n", 3),  # never past the next sync
        ("sync_every = 1\nouter_delay = 3\n", 1),
    ],
)
def test_an_overlapped_sync_lands_after_its_delay(tmp_path, extra, delay):
    comp = job(tmp_path, "[compression]\n" + extra).compression
    assert comp.landing_delay() == delay


def test_outer_delay_is_left_out_unset_and_checked(tmp_path):
    assert (
        "outer_delay"
        not in job(tmp_path, "[compression]\nsync_every = 4\n").model_dump(mode="json")["compression"]
    )
    set_ = job(tmp_path, "[compression]\nsync_every = 4\nouter_delay = 2\n").model_dump(mode="json")
    assert set_["compression"]["outer_delay"] == 2
    with pytest.raises(JobSpecError) as err:
        job(tmp_path, "[compression]\nsync_every = 4\nouter_delay = 0\n")
    assert "`compression.outer_delay" in str(err.value)
