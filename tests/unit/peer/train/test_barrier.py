"""The start barrier's READY is re-sent until the leader answers (a refused first copy costs no plan)."""

from __future__ import annotations

import asyncio
import json

import pytest

from potluck.peer.train import barrier
from potluck.protocol.identity import Identity
from potluck.protocol.training import StageAssignment, TrainPlan

IDS = [Identity.generate().peer_id for _ in range(2)]


class LossyBox:
    """Two peers' mailboxes in one: the first ``drop`` messages to the leader are lost (refused by a
    receiver that did not follow the plan yet); the leader answers go once a READY arrives."""

    def __init__(self, me: str, leader: str, drop: int) -> None:
        self.peer_id, self.leader, self.drop = me, leader, drop
        self.sent: list[bytes] = []
        self.go: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def send(self, peer: str, tag: int, payload: bytes) -> None:
        assert peer == self.leader
        self.sent.append(payload)
        if len(self.sent) > self.drop and not self.go.done():
            self.go.set_result(json.dumps({"go": True, "reason": "", "missing": []}).encode())

    async def recv(self, peer: str, tag: int, timeout_s: float | None = None) -> bytes:
        return await asyncio.wait_for(asyncio.shield(self.go), timeout_s)

    def suspect(self, peer: str) -> None:
        raise AssertionError(f"no peer should be suspected, got {peer}")


def _plan() -> TrainPlan:
    stages = [StageAssignment(first_layer=j, last_layer=j + 1, peers=[p]) for j, p in enumerate(IDS)]
    return TrainPlan(job="j", epoch=3, start_step=10, stages=stages, micro_batches=1, issued_at=1.0)


def test_a_lost_ready_is_sent_again_until_the_leader_answers(monkeypatch):
    monkeypatch.setattr(barrier, "RESEND_S", 0.02)
    plan = _plan()
    me = next(p for p in IDS if p != plan.leader)

    async def run() -> LossyBox:
        box = LossyBox(me, plan.leader, drop=2)
        await barrier.start_barrier(box, plan, wait_s=5.0)  # type: ignore[arg-type]
        return box

    box = asyncio.run(run())
    assert len(box.sent) == 3 and len(set(box.sent)) == 1  # the same READY, three times
    assert json.loads(box.sent[0]) == {"ok": True, "reason": ""}


def test_without_an_answer_the_barrier_still_ends_at_its_bound(monkeypatch):
    monkeypatch.setattr(barrier, "RESEND_S", 0.02)
    plan = _plan()
    me = next(p for p in IDS if p != plan.leader)

    async def run() -> None:
        box = LossyBox(me, plan.leader, drop=10**6)
        await barrier.start_barrier(box, plan, wait_s=0.1)  # type: ignore[arg-type]

    with pytest.raises((TimeoutError, barrier.StartError)):
        asyncio.run(run())
