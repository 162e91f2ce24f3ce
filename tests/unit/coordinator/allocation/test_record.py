"""The Allocation record: consistent, bounded, strict."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from potluck.protocol.allocation import MAX_ALLOCATION_BYTES, Allocation
from potluck.sim.cluster import peer_id


def record(**over):
    base = dict(
        round=3,
        policy="max_min",
        lease_start=100.0,
        lease_end=400.0,
        solved_at=100.0,
        issued_at=100.0,
        classes=[{"peer_class": "v100", "workers": 2}, {"peer_class": "k80", "workers": 1}],
        rows=[
            {
                "jobs": ["a"],
                "present_s": 900.0,
                "shares": [{"peer_class": "v100", "allocation": 0.5, "received_s": 450.0}],
            },
            {
                "jobs": ["b"],
                "present_s": 900.0,
                "shares": [{"peer_class": "k80", "allocation": 1.0, "received_s": 300.0}],
            },
        ],
        leases=[
            {"jobs": ["a"], "peer_class": "v100", "peers": [peer_id(0)]},
            {"jobs": ["b"], "peer_class": "k80", "peers": [peer_id(1)]},
        ],
    )
    base.update(over)
    return Allocation(**base)


def test_a_valid_record_and_its_views():
    a = record()
    assert a.jobs == ["a", "b"] and a.assignment()[peer_id(0)] == ("a",)
    assert a.allocation_of("a") == {"v100": 0.5} and a.received_share("b") == {"k80": pytest.approx(1 / 3)}
    assert Allocation.model_validate_json(a.model_dump_json()) == a


@pytest.mark.parametrize(
    "over",
    [
        {"lease_end": 50.0},
        {
            "leases": [
                {"jobs": ["a"], "peer_class": "v100", "peers": [peer_id(0)]},
                {"jobs": ["b"], "peer_class": "k80", "peers": [peer_id(0)]},
            ]
        },
        {"leases": [{"jobs": ["zz"], "peer_class": "v100", "peers": [peer_id(0)]}]},
        {"leases": [{"jobs": ["a"], "peer_class": "tpu", "peers": [peer_id(0)]}]},
        {
            "rows": [
                {
                    "jobs": ["a"],
                    "present_s": 1.0,
                    "shares": [
                        {"peer_class": "v100", "allocation": 0.7, "received_s": 0.0},
                        {"peer_class": "k80", "allocation": 0.7, "received_s": 0.0},
                    ],
                }
            ],
            "leases": [],
        },
        {"rows": [{"jobs": ["a", "b"], "present_s": 1.0}], "leases": []},
        {"surprise": 1},
    ],
)
def test_inconsistent_records_are_refused(over):
    with pytest.raises(ValidationError):
        record(**over)


def test_size_is_bounded():
    many = [{"jobs": [f"j{i}"], "peer_class": "v100", "peers": [peer_id(i)]} for i in range(1000)]
    rows = [{"jobs": [f"j{i}"], "present_s": 0.0} for i in range(1000)]
    with pytest.raises(ValidationError, match=str(MAX_ALLOCATION_BYTES)):
        record(rows=rows, leases=many, classes=[{"peer_class": "v100", "workers": 1000}])
