"""docs/telemetry.md is the reference for people writing their own subscribers: each topic's example
payload must be complete (every field of its schema) and valid, and every topic the code publishes must be
documented."""

import json
import re
from pathlib import Path

import pytest

from potluck.protocol import telemetry as t

DOC = Path(__file__).resolve().parents[3] / "docs" / "telemetry.md"
KINDS = {
    ("peer", "status"): t.PeerStatus,
    ("peer", "metrics"): t.PeerMetrics,
    ("peer", "events"): t.Event,
    ("coordinator", "status"): t.CoordinatorStatus,
    ("coordinator", "links"): t.CoordinatorLinks,
    ("coordinator", "events"): t.Event,
}


def examples() -> dict[tuple[str, str], dict]:
    out = {}
    for topic, body in re.findall(r"```json topic=(\S+)\n(.*?)```", DOC.read_text(), re.S):
        parts = topic.split("/")
        key = (parts[2], parts[-1])
        out[key] = json.loads(body)
    return out


def test_every_topic_has_a_documented_example():
    assert set(examples()) == set(KINDS)
    for role, kind in KINDS:
        assert f"`potluck/<swarm>/{role}/" in DOC.read_text() and f"/{kind}`" in DOC.read_text()


@pytest.mark.parametrize("key", sorted(KINDS))
def test_each_example_is_complete_and_valid(key):
    example = examples()[key]
    model = KINDS[key]
    model.model_validate({k: v for k, v in example.items() if k != "sig"})
    missing = set(model.model_fields) - set(example)
    assert not missing, f"{key}: the example lacks {sorted(missing)}"
    assert "sig" in example
