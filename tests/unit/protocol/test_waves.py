"""StageAssignment.waves (issue 19): a peer running two replicas' shares as tick-tock waves; plans
without waves keep their signed bytes; the data shards follow the waves."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from potluck.protocol.identity import Identity
from potluck.protocol.records import canonical_json
from potluck.protocol.training import StageAssignment, TrainPlan

PEERS = sorted(Identity.generate().peer_id for _ in range(3))


def plan(waves: list[int] | None, stages: int = 1) -> TrainPlan:
    if stages == 1:
        rows = [StageAssignment(first_layer=0, last_layer=4, peers=PEERS, waves=waves)]
    else:
        rows = [
            StageAssignment(first_layer=0, last_layer=2, peers=PEERS[:1], waves=waves),
            StageAssignment(first_layer=2, last_layer=4, peers=PEERS[1:2]),
        ]
    return TrainPlan(job="j", epoch=1, start_step=0, stages=rows, micro_batches=2, issued_at=1.0)


def test_a_plan_without_waves_signs_the_bytes_older_peers_sign() -> None:
    p = plan(None)
    body = json.loads(p.canonical_bytes())
    assert "waves" not in body["stages"][0]
    assert p.canonical_bytes() == canonical_json(body)
    assert p.data_replicas == 3 and [list(p.shards(0, i)) for i in range(3)] == [[0], [1], [2]]


def test_waves_give_a_peer_consecutive_shards_and_survive_the_signed_encoding() -> None:
    p = plan([1, 2, 1])
    assert p.data_replicas == 4 and p.n_replicas == 3
    assert [list(p.shards(0, i)) for i in range(3)] == [[0], [1, 2], [3]]
    again = TrainPlan.model_validate_json(p.canonical_bytes())
    assert again.stages[0].waves == [1, 2, 1] and again.canonical_bytes() == p.canonical_bytes()


@pytest.mark.parametrize("bad", [[2, 2], [1, 3, 1], [0, 1, 1]])
def test_waves_need_one_entry_of_one_or_two_per_replica(bad: list[int]) -> None:
    with pytest.raises(ValidationError, match="waves needs one entry"):
        plan(bad)


def test_waves_are_refused_in_a_pipeline() -> None:
    with pytest.raises(ValidationError, match="one-stage plan"):
        plan([2], stages=2)
