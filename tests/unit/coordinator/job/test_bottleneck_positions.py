"""Where a bottleneck job's maps live across re-plans (``TrainPlan.bottlenecks``, model/bottleneck.py):
the plan's own cuts until set, validated when set, left out of the signed bytes when not, and kept by
the coordinator from the first plan on (``keep_bottlenecks``)."""

import itertools

import pytest
from pydantic import ValidationError

from potluck.cli.views.job import plan_table
from potluck.coordinator.job.plan import keep_bottlenecks
from potluck.protocol.training import StageAssignment, TrainPlan
from tests.unit.protocol.conftest import NOW, make_job
from tests.unit.protocol.test_training_records import A, B, C


def cut_at(*starts: int, bottlenecks: list[int] | None = None) -> TrainPlan:
    edges, peers = [0, *starts, 4], [A, B, C]
    stages = [
        StageAssignment(first_layer=a, last_layer=b, peers=[peers[j]])
        for j, (a, b) in enumerate(itertools.pairwise(edges))
    ]
    return TrainPlan(
        job="tiny",
        epoch=1,
        start_step=0,
        micro_batches=1,
        issued_at=NOW,
        stages=stages,
        bottlenecks=bottlenecks,
    )


def test_positions_default_to_the_plans_cuts_and_are_validated():
    assert cut_at(2).bottleneck_cuts == (2,) and cut_at(1, 3).cuts == (1, 3)
    assert cut_at(3, bottlenecks=[2]).bottleneck_cuts == (2,)
    assert cut_at(bottlenecks=[1, 3]).bottleneck_cuts == (1, 3)  # one stage: both applied in place
    for bad in ([4], [0], [3, 1], [2, 2]):
        with pytest.raises(ValidationError, match="bottleneck positions"):
            cut_at(2, bottlenecks=bad)
    assert b"bottlenecks" not in cut_at(2).canonical_bytes()
    assert b'"bottlenecks":[2]' in cut_at(3, bottlenecks=[2]).canonical_bytes()


def test_the_coordinator_keeps_the_first_plans_positions():
    job = make_job()
    ranked = job.model_copy(update={"model": job.model.model_copy(update={"bottleneck_rank": 4})})
    first = keep_bottlenecks(ranked, None, cut_at(2))
    assert first.bottlenecks == [2]
    moved = keep_bottlenecks(ranked, first.bottleneck_cuts, cut_at(1, 3))
    assert moved.bottlenecks == [2] and moved.cuts == (1, 3)
    assert keep_bottlenecks(ranked, moved.bottleneck_cuts, cut_at()).bottlenecks == [2]
    assert (
        keep_bottlenecks(job, first.bottleneck_cuts, cut_at(3)).bottlenecks is None
    )  # no bottleneck: nothing to keep


def test_the_plan_table_names_the_positions():
    title = str(plan_table(cut_at(3, bottlenecks=[2]), "why").title)
    assert title.endswith("from step 0; bottlenecks at layer(s) 2")
    assert "bottlenecks" not in str(plan_table(cut_at(2), "why").title)
