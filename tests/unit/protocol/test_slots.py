"""Hardware.slots (issue 19): a peer may offer two work slots; one-slot records keep their old bytes."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from potluck.protocol.identity import Identity
from potluck.protocol.records import PeerRecord, canonical_json
from tests.unit.protocol.conftest import make_hardware, make_peer_record


def test_one_slot_is_the_default_and_its_bytes_are_the_old_ones() -> None:
    rec = make_peer_record(Identity.generate())
    assert rec.hardware.slots == 1
    body = json.loads(rec.canonical_bytes())
    assert "slots" not in body["hardware"]  # what a release without the field signs and accepts
    assert rec.canonical_bytes() == canonical_json(body)


def test_two_slots_round_trip_through_the_signed_encoding() -> None:
    rec = make_peer_record(Identity.generate(), hardware=make_hardware(slots=2))
    assert json.loads(rec.canonical_bytes())["hardware"]["slots"] == 2
    again = PeerRecord.model_validate_json(rec.canonical_bytes())
    assert again.hardware.slots == 2 and again.canonical_bytes() == rec.canonical_bytes()


@pytest.mark.parametrize("bad", [0, 3, "two"])
def test_slots_are_bounded(bad: object) -> None:
    with pytest.raises(ValidationError):
        make_hardware(slots=bad)


def test_a_record_without_slots_validates_as_one_slot() -> None:
    body = json.loads(make_peer_record(Identity.generate()).canonical_bytes())
    assert PeerRecord.model_validate(body).hardware.slots == 1


def test_a_pair_speedup_is_written_only_when_measured() -> None:
    rec = make_peer_record(Identity.generate(), hardware=make_hardware(slots=2))
    assert "pair_speedup" not in json.loads(rec.canonical_bytes())["hardware"]
    rec = make_peer_record(Identity.generate(), hardware=make_hardware(slots=2, pair_speedup=1.6))
    again = PeerRecord.model_validate_json(rec.canonical_bytes())
    assert again.hardware.pair_speedup == 1.6 and again.canonical_bytes() == rec.canonical_bytes()


@pytest.mark.parametrize("bad", [0.0, -1.0, 2.5, float("nan")])
def test_a_pair_speedup_is_bounded(bad: float) -> None:
    with pytest.raises(ValidationError):
        make_hardware(slots=2, pair_speedup=bad)
