"""A bottleneck job's cuts and its positions (coordinator/job/positions.py): splits at the positions,
their memory check, and the planner moving the cuts onto the positions where the narrow cuts pay for
the compute imbalance (slow links) but not where they do not (fast links)."""

import pytest

from potluck.coordinator.job.plan import make_train_plan, step_job
from potluck.coordinator.job.positions import fits_memory, position_splits, resplit
from potluck.protocol.jobspec import JobSpec
from tests.unit.coordinator.job.test_codecs import slow_swarm
from tests.unit.coordinator.job.test_plan import JOB

RANKED = JOB.model_copy(update={"model": JOB.model.model_copy(update={"bottleneck_rank": 8})})  # of 64
# wide enough that a full-width cut costs more on a home uplink than a layer of compute
WIDE = JobSpec.model_validate(
    {
        "name": "w",
        "min_peers": 2,
        "model": {"n_layers": 4, "d_model": 512, "n_heads": 8, "vocab_size": 256, "seq_len": 256},
        "batch": {"tokens_per_step": 256 * 16, "micro_batch_size": 2},
        "limits": {"stages": 2, "replicas": 1},  # one pipeline: no replica sync to weigh
    }
)
WIDE_RANKED = WIDE.model_copy(update={"model": WIDE.model.model_copy(update={"bottleneck_rank": 32})})


def test_splits_cut_only_at_positions_and_keep_each_stages_peers():
    assert position_splits([3, 1, 2], 3) == [(1, 2), (1, 3), (2, 3)]
    assert position_splits([2], 3) == []  # two cuts, one position
    plan, _, reason = make_train_plan(slow_swarm(4, 5.0), RANKED, 100.0, 1, 0)
    assert plan is not None, reason
    moved = resplit(plan, [1])
    assert [(st.first_layer, st.last_layer) for st in moved.stages] == [(0, 1), (1, 4)]
    assert [st.peers for st in moved.stages] == [st.peers for st in plan.stages]
    sj = step_job(RANKED)
    assert fits_memory(moved, sj, [8.0, 8.0])
    assert not fits_memory(moved, sj, [8.0, 1e-4])  # the 3-layer stage's peers hold 100 kB


@pytest.mark.slow  # three plans, each a 2 s search
@pytest.mark.parametrize(("gbps", "cut"), [(0.005, 1), (50.0, 2)])
def test_the_planner_keeps_the_positions_where_the_narrow_cut_pays(gbps, cut):
    """Even peers split 4 layers 2 + 2. With the bottleneck fixed at layer 1 by an earlier plan, a cut
    at 2 would carry 512 numbers a token instead of 32: on 5 Mbit/s links the planner cuts at 1 (one
    stage computes 3 layers), on 50 Gbit/s it keeps the balanced cut at 2."""
    state = slow_swarm(2, gbps)
    plain, _, _ = make_train_plan(state, WIDE_RANKED, 100.0, 1, 0)
    assert plain is not None and plain.cuts == (2,)
    plan, _, reason = make_train_plan(state, WIDE_RANKED, 100.0, 1, 0, positions=[1])
    assert plan is not None and plan.cuts == (cut,), reason
    if cut == 1:
        assert "cut at the bottleneck positions [1]" in reason
    else:
        assert "cut off the bottleneck positions [1]" in reason
    # a job without a bottleneck ignores positions
    same, _, _ = make_train_plan(state, WIDE, 100.0, 1, 0, positions=[1])
    assert same is not None and same.cuts == (2,)
