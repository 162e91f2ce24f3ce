"""The deadline policy's pure parts: the deadline from measured compute times, the test-only slowdown,
and the commit leader's decision when a replica was left out of its stage's all-reduce."""

import pytest

from potluck.peer.train.commit import Ready, _complete, _decide, _parse_ready
from potluck.peer.train.straggle import deadline_s
from potluck.protocol.errors import WireError
from potluck.protocol.identity import Identity
from potluck.protocol.training import StageAssignment, TrainPlan

A, B, C, D, E, F = (Identity.generate().peer_id for _ in range(6))


def test_deadline_is_a_multiple_of_the_median_with_a_floor_and_a_cap():
    assert deadline_s([0.2, 0.3, 9.0], factor=2.0, floor_s=0.1, cap_s=60.0) == pytest.approx(0.6)
    assert deadline_s([0.01, 0.02, 0.03], factor=2.0, floor_s=0.5, cap_s=60.0) == 0.5  # floor
    assert deadline_s([40.0, 50.0], factor=2.0, floor_s=0.5, cap_s=60.0) == 60.0  # cap
    assert deadline_s([], factor=2.0, floor_s=0.5, cap_s=60.0) == 60.0  # first step: wait for all


def test_deadline_follows_the_measured_times():
    fast = deadline_s([0.1] * 16, factor=1.5, floor_s=0.0, cap_s=100.0)
    slow = deadline_s([2.0] * 16, factor=1.5, floor_s=0.0, cap_s=100.0)
    assert fast == pytest.approx(0.15) and slow == pytest.approx(3.0)


def plan(grid: list[list[str]]) -> TrainPlan:
    stages = [StageAssignment(first_layer=j, last_layer=j + 1, peers=row) for j, row in enumerate(grid)]
    return TrainPlan(job="t", epoch=1, start_step=0, micro_batches=2, issued_at=0.0, stages=stages)


def test_a_left_out_replica_is_not_waited_for_and_gets_the_contributors_norm():
    p = plan([[A, B, C]])
    members = (0, 1)
    readies = {A: Ready(0, 0, 4.0, 0.5, members=members)}
    assert not _complete(p, readies)  # B named as a member: still needed
    readies[B] = Ready(0, 1, 4.0, 0.7, members=members)
    assert _complete(p, readies)  # C was left out: no READY needed from it
    d = _decide(p, readies)
    assert d.committed and d.norms == (2.0, 2.0, 2.0)
    assert d.loss == pytest.approx((0.5 + 0.7) * 3 / 2)  # renormalised over the contributors


def test_strict_readies_need_everyone_and_keep_the_plain_sum():
    p = plan([[A, B], [C, D]])
    readies = {A: Ready(0, 0, 4.0, 0.0), B: Ready(0, 1, 4.0, 0.0), C: Ready(1, 0, 5.0, 1.25)}
    assert not _complete(p, readies)
    assert not _decide(p, readies).committed
    readies[D] = Ready(1, 1, 5.0, 1.5)
    d = _decide(p, readies)
    assert _complete(p, readies) and d.committed and d.norms == (3.0, 3.0) and d.loss == 2.75


def test_each_stage_leaves_out_its_own_replicas():
    p = plan([[A, B], [C, D]])
    readies = {
        A: Ready(0, 0, 1.0, 0.0, members=(0,)),  # stage 0 left replica 1 out
        C: Ready(1, 0, 3.0, 1.0, members=(0, 1)),
        D: Ready(1, 1, 3.0, 2.0, members=(0, 1)),
    }
    assert _complete(p, readies)
    d = _decide(p, readies)
    assert d.committed and d.norms == (2.0, 2.0) and d.loss == 3.0


def test_disagreeing_members_or_a_mix_with_strict_abort():
    p = plan([[A, B, C]])
    split = {A: Ready(0, 0, 1.0, 0.1, members=(0, 1)), B: Ready(0, 1, 1.0, 0.1, members=(0, 1, 2))}
    d = _decide(p, split)
    assert not d.committed and "disagree" in d.reason
    mixed = {A: Ready(0, 0, 1.0, 0.1, members=(0, 1)), B: Ready(0, 1, 1.0, 0.1), C: Ready(0, 2, 1.0, 0.1)}
    assert not _decide(p, mixed).committed


def test_a_failed_member_aborts_the_step():
    p = plan([[A, B, C]])
    readies = {A: Ready(0, 0, 1.0, 0.1, members=(0, 1)), B: Ready(0, 1, 0.0, 0.0, ok=False, reason="boom")}
    d = _decide(p, readies)
    assert not d.committed and "boom" in d.reason


def test_ready_members_are_checked():
    ok = b'{"stage":0,"replica":1,"sq_norm":2.0,"loss":0.5,"ok":true,"members":[0,1]}'
    assert _parse_ready(ok, "b", (0, 1), 3).members == (0, 1)
    with pytest.raises(WireError, match="names members"):  # a READY must count its own replica in
        _parse_ready(ok.replace(b"[0,1]", b"[0,2]"), "b", (0, 1), 3)
    with pytest.raises(WireError, match="names members"):
        _parse_ready(ok.replace(b"[0,1]", b"[1,7]"), "b", (0, 1), 3)
    with pytest.raises(WireError, match="lacks fields"):
        _parse_ready(ok.replace(b"[0,1]", b'"all"'), "b", (0, 1), 3)
