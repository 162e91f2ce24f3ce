"""The commit's termination questions: a peer that missed the leader's decision gets it from another
peer that has it, never a forged one, and an answer waits for the answering peer's own wait to end."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from potluck.net.tags import INDEX_BITS, Round, Stream, Tag, make_tag
from potluck.peer.train.termination import Decisions
from potluck.protocol.errors import WireError
from potluck.protocol.identity import Identity
from potluck.protocol.training import TrainPlan
from potluck.testbed.harness.training import make_plan, tiny_job

KEYS = [Identity.generate() for _ in range(4)]
IDS = [k.peer_id for k in KEYS]  # the leader, its stage's other replica, stage 1's two replicas
RND = Round(3, 41)
BODY = json.dumps({"committed": True, "norms": [1.0, 1.0], "loss": 2.5, "reason": ""}).encode()


def _plan(job: str = "j") -> TrainPlan:
    """The leader and its stage's other replica, then stage 1's two replicas, in plan epoch 3."""
    return make_plan(tiny_job(name=job), [IDS[:2], IDS[2:]], [(0, 2), (2, 4)], epoch=3)


class Net:
    """In-memory mailboxes of the plan's peers: messages of a served stream go to the handler, the
    rest wait in a buffer for ``recv``; ``dead`` peers take nothing."""

    def __init__(self) -> None:
        self.boxes: dict[str, Box] = {}
        self.dead: set[str] = set()


class Box:
    def __init__(self, net: Net, peer_id: str) -> None:
        self.net, self.peer_id = net, peer_id
        self.cfg = SimpleNamespace(timeout_s=2.0)
        self.services: dict[int, object] = {}
        self.buffer: dict[tuple[str, Tag], asyncio.Future[bytes]] = {}
        net.boxes[peer_id] = self

    def serve(self, stream: int, max_bytes: int, handler) -> None:
        self.services[int(stream)] = handler

    def _slot(self, key: tuple[str, Tag]) -> asyncio.Future[bytes]:
        return self.buffer.setdefault(key, asyncio.get_running_loop().create_future())

    async def send(self, peer: str, tag: Tag, payload: bytes) -> None:
        if peer in self.net.dead:
            raise WireError(f"send to {peer} failed: gone")
        box = self.net.boxes[peer]
        handler = box.services.get(tag.stream >> INDEX_BITS)
        if handler is not None:
            handler(self.peer_id, tag, payload)
        else:
            box._slot((self.peer_id, tag)).set_result(payload)

    async def send_quietly(self, peer: str, tag: Tag, payload: bytes) -> str | None:
        try:
            await self.send(peer, tag, payload)
        except WireError as e:
            return str(e)
        return None

    async def recv(self, peer: str, tag: Tag, timeout_s: float | None = None) -> bytes:
        try:
            return await asyncio.wait_for(asyncio.shield(self._slot((peer, tag))), timeout_s)
        except TimeoutError:
            raise WireError(f"no message from {peer}") from None


def _swarm(plan: TrainPlan) -> tuple[Net, list[Decisions]]:
    net = Net()
    return net, [Decisions(Box(net, p), plan, k) for p, k in zip(IDS, KEYS, strict=True)]  # type: ignore[arg-type]


def test_a_sealed_decision_opens_relayed_only_with_the_leaders_signature_for_this_job_and_round():
    plan = _plan()
    _, (leader, peer, *_) = _swarm(plan)
    sealed = leader.seal(RND, BODY)
    assert peer.open(RND, sealed, IDS[2], relayed=True) == BODY
    with pytest.raises(WireError, match="not signed by the leader"):
        peer.open(Round(3, 42), sealed, IDS[2], relayed=True)  # another step's decision
    with pytest.raises(WireError, match="not signed by the leader"):
        peer.open(RND, sealed.replace(b"2.5", b"0.5"), IDS[2], relayed=True)  # its loss changed
    other_job = Decisions(peer.box, _plan("k"), KEYS[0])
    with pytest.raises(WireError, match="not signed by the leader"):
        peer.open(RND, other_job.seal(RND, BODY), IDS[2], relayed=True)
    forged = Decisions(peer.box, plan, KEYS[3]).seal(RND, BODY)  # a peer signing as if it led
    with pytest.raises(WireError, match="not signed by the leader"):
        peer.open(RND, forged, IDS[3], relayed=True)
    unsigned = Decisions(peer.box, plan, None).seal(RND, BODY)
    assert peer.open(RND, unsigned, IDS[0]) == BODY  # straight from the leader: its stream vouches
    with pytest.raises(WireError, match="not signed by the leader"):
        peer.open(RND, unsigned, IDS[2], relayed=True)


def test_a_peer_that_missed_the_decision_gets_it_from_one_that_has_it():
    async def main():
        net, (leader, missed, got, late) = _swarm(_plan())
        net.dead.add(IDS[0])
        for d in (missed, got, late):
            d.waiting(RND)
        got.settle(RND, leader.seal(RND, BODY))
        missed.settle(RND, None)
        asking = asyncio.create_task(missed.ask(RND, 2.0))
        await asyncio.sleep(0.2)
        assert asking.done()  # the first decision that verifies ends the question: no wait for ``late``
        late.settle(RND, None)
        return asking.result()

    assert asyncio.run(main()) == BODY


def test_an_answer_waits_for_the_answering_peers_own_wait():
    """A COMMIT still on its way to a peer is never answered "nothing": the answer comes when it lands."""

    async def main():
        _net, (leader, missed, slow, other) = _swarm(_plan())
        for d in (missed, slow, other):
            d.waiting(RND)
        missed.settle(RND, None)
        other.settle(RND, None)
        asking = asyncio.create_task(missed.ask(RND, 2.0))
        await asyncio.sleep(0.2)
        assert not asking.done()  # ``slow`` has not answered: its own wait is still on
        slow.settle(RND, leader.seal(RND, BODY))
        return await asking

    assert asyncio.run(main()) == BODY


def test_nobody_got_it_or_only_a_forgery_means_no_decision():
    async def main():
        net, (_leader, missed, liar, other) = _swarm(_plan())
        net.dead.add(IDS[0])
        for d in (missed, liar, other):
            d.waiting(RND)
        missed.settle(RND, None)
        other.settle(RND, None)
        liar.settle(RND, liar.seal(RND, BODY))  # signed by itself, not by the leader
        return await missed.ask(RND, 2.0)

    assert asyncio.run(main()) is None


def test_a_round_never_waited_for_is_answered_empty_at_once_and_each_asker_once():
    async def main():
        net, (_leader, asker, idle, _other) = _swarm(_plan())
        net.dead.add(IDS[3])  # a second peer gone: the question cannot reach it
        answered = await asyncio.wait_for(asker.ask(RND, 5.0), 1.0)  # ``idle`` never waited: no delay
        before = len(idle._answered)
        idle._on_ask(IDS[1], make_tag(RND, Stream.COMMIT_ASK), b"")  # the same question again
        idle._on_ask("12D3KooWnotaplanpeer", make_tag(RND, Stream.COMMIT_ASK), b"")  # an outsider
        return answered, before, len(idle._answered)

    answered, before, after = asyncio.run(main())
    assert answered is None
    assert before == after == 1
