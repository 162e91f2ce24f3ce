"""Per-link activation codecs in the signed records (issue 22): the plan's ``link_codecs``, the job's
``activations_slow`` and the progress record's ``activation_ratio`` are left out of the signed bytes at
their defaults (older peers sign and read those records unchanged), travel through a signed envelope
when set, and malformed entries are refused at parse time."""

import pytest
from pydantic import ValidationError

from potluck.protocol.envelope import seal
from potluck.protocol.jobspec import CompressionSpec
from potluck.protocol.training import LinkCodecs, Progress, TrainPlan
from tests.unit.protocol.conftest import NOW, make_job
from tests.unit.protocol.test_envelope import check
from tests.unit.protocol.test_training_records import A, plan

SLOW, FAST = "int4:block=32|zstd", "int8:block=64"


def links(forward=((1, 0),), backward=((0, 0),)) -> LinkCodecs:
    return LinkCodecs(
        chains=[FAST, SLOW], forward=[list(r) for r in forward], backward=[list(r) for r in backward]
    )


def test_plan_without_link_codecs_signs_the_bytes_it_always_did():
    p = plan()
    assert p.link_codecs is None and b"link_codecs" not in p.canonical_bytes()
    # the same record as a release without the field would write it: the key is simply absent
    body = p.model_dump(mode="json")
    del body["link_codecs"], body["stop_at"]
    assert TrainPlan.model_validate(body).canonical_bytes() == p.canonical_bytes()


def test_link_codecs_round_trip_through_a_signed_envelope(policy, coordinator):
    p = plan(link_codecs=links())
    assert b'"link_codecs"' in p.canonical_bytes()
    v = check(policy, seal(coordinator, "swarm-a", "plan", p, NOW + 30), name="plan")
    assert isinstance(v.record, TrainPlan) and v.record.link_codecs == links()
    assert v.record.link_chain(0, 0, False, FAST) == SLOW
    assert v.record.link_chain(0, 0, True, "x") == FAST
    assert plan().link_chain(0, 1, False, "the job's") == "the job's"


@pytest.mark.parametrize(
    ("entries", "words"),
    [
        (links(forward=((1,),)), "one entry per replica"),
        (links(backward=((0, 0, 0),)), "one entry per replica"),
        (links(forward=((1, 0), (0, 0))), "one row per stage boundary"),  # two stages: one boundary
    ],
)
def test_link_codecs_must_cover_every_boundary_and_replica(entries, words):
    with pytest.raises(ValidationError, match=words):
        plan(link_codecs=entries)


def test_indices_must_name_a_chain_and_chains_must_not_repeat():
    with pytest.raises(ValidationError, match="past the 2 chains"):
        links(forward=((2, 0),))
    with pytest.raises(ValidationError, match="repeat"):
        LinkCodecs(chains=[FAST, FAST], forward=[[0]], backward=[[1]])
    with pytest.raises(ValidationError):
        LinkCodecs(chains=[FAST] * 17, forward=[[0]], backward=[[0]])


@pytest.mark.parametrize("chain", ["", "int8\nzstd", "int8;rm -rf", "x" * 257, "int8|zstd\x00"])
def test_a_chain_outside_the_spec_alphabet_or_too_long_is_refused(chain):
    with pytest.raises(ValidationError):
        LinkCodecs(chains=[chain], forward=[[0]], backward=[[0]])


def test_too_many_replicas_in_a_link_entry_are_refused():
    with pytest.raises(ValidationError):
        LinkCodecs(chains=[FAST], forward=[[0] * 4097], backward=[[0]])


def test_compression_section_omits_its_link_fields_at_their_defaults():
    job = make_job()
    assert b"activations_slow" not in job.canonical_bytes() and b"slow_link_gbps" not in job.canonical_bytes()
    comp = CompressionSpec(activations_slow=SLOW, slow_link_gbps=0.5)
    dumped = comp.model_dump(mode="json")
    assert dumped["activations_slow"] == SLOW and dumped["slow_link_gbps"] == 0.5
    assert CompressionSpec.model_validate(dumped) == comp
    with pytest.raises(ValidationError):
        CompressionSpec(slow_link_gbps=0.0)
    with pytest.raises(ValidationError):
        CompressionSpec(activations_slow="")


def _progress(**kw) -> Progress:
    base = dict(peer_id=A, job="tiny", epoch=1, stage=0, replica=0, step=3, issued_at=NOW)
    return Progress(**(base | kw))


def test_progress_activation_ratio_is_optional_and_bounded():
    assert b"activation_ratio" not in _progress().canonical_bytes()
    rec = _progress(activation_ratio=3.9)
    assert Progress.model_validate_json(rec.canonical_bytes()).activation_ratio == 3.9
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e7):
        with pytest.raises(ValidationError):
            _progress(activation_ratio=bad)
