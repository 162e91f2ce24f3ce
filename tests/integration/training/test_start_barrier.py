"""The start barrier (peer/train/barrier.py): a plan's first step runs under the step budget, and a peer
that cannot take its state, or never comes, stops the others at once instead of after a long grace.

Real p2pd daemons on loopback, one Trainer per peer in one event loop; ``start_wait_s`` is set far above
each test's own bound, so a wait that still carried the old first-step grace would fail the test."""

from __future__ import annotations

import asyncio

import pytest

from potluck.testbed.harness.training import PROTOCOL, make_plan, tiny_dataset, tiny_job

SPLITS = [(0, 2), (2, 4)]  # [first, last) layers
BOUND_S = 60.0  # each scenario must end well within this; start_wait_s is 600


async def _trainers(nodes, n_run: int, grid, splits, cfg, tmp_path):
    """Mailboxes on every (node, identity), one plan over them, Trainers for the first ``n_run`` peers."""
    from potluck.net.config import TransportConfig
    from potluck.net.mailbox import Mailbox
    from potluck.peer.train.trainer import Trainer

    job = tiny_job()
    dataset = tiny_dataset(job)
    keys = {node.peer_id.to_base58(): identity for node, identity in nodes}  # pipelines are sealed
    boxes = [Mailbox(node, PROTOCOL, TransportConfig(timeout_s=3)) for node, _ in nodes]
    for b in boxes:
        await b.start()
    ids = [b.peer_id for b in boxes]
    plan = make_plan(job, [[ids[i] for i in row] for row in grid], splits)
    return (
        boxes,
        plan,
        [Trainer(b, job, plan, dataset, cfg, tmp_path, identity=keys[b.peer_id]) for b in boxes[:n_run]],
    )


async def _run(tr, *errors):
    try:
        await tr.run()
    except errors as e:
        return e
    return "finished"


def test_a_peer_dying_right_after_the_barrier_fails_the_first_step_within_the_step_budget(tmp_path):
    from potluck.peer.config import TrainerConfig
    from potluck.peer.errors import PeerError
    from potluck.peer.train.barrier import start_barrier
    from potluck.testbed.harness.p2p import keyed_group

    cfg = TrainerConfig(step_timeout_s=4.0, allreduce_timeout_s=3.0, start_wait_s=600.0)

    async def main():
        async with keyed_group(4, tmp_path) as nodes:
            boxes, plan, trainers = await _trainers(nodes, 3, [[0, 1], [2, 3]], SPLITS, cfg, tmp_path)

            async def victim():  # takes its state, passes the barrier, dies before its first message
                await start_barrier(boxes[3], plan, cfg.start_wait_s)
                await nodes[3][0].shutdown()
                return "died"

            runs = [_run(t, PeerError) for t in trainers] + [victim()]
            return await asyncio.wait_for(asyncio.gather(*runs), BOUND_S), trainers, boxes

    results, trainers, boxes = asyncio.run(main())
    assert results[3] == "died"
    assert all(isinstance(r, Exception) for r in results[:3]), results
    assert [t.step for t in trainers] == [0, 0, 0]  # the first step was applied by nobody
    victim_id = boxes[3].peer_id
    # Its pipeline partner (stage 0, replica 1) and its stage's other replica waited on it: they name it.
    assert victim_id in boxes[1].take_suspects()
    assert victim_id in boxes[2].take_suspects()


def test_a_peer_that_cannot_take_its_state_stops_the_plan_at_once_with_its_reason(tmp_path):
    from potluck.peer.config import TrainerConfig
    from potluck.peer.errors import StartError
    from potluck.testbed.harness.p2p import keyed_group
    from potluck.transfer.errors import StateError

    cfg = TrainerConfig(step_timeout_s=4.0, start_wait_s=600.0)

    async def main():
        async with keyed_group(4, tmp_path) as nodes:
            _, _, trainers = await _trainers(nodes, 4, [[0, 1], [2, 3]], SPLITS, cfg, tmp_path)

            async def no_state():
                raise StateError("no holder of layers 2-3 at step 0 answered")

            trainers[2]._restore = no_state  # type: ignore[method-assign]
            runs = [_run(t, StartError, StateError) for t in trainers]
            return await asyncio.wait_for(asyncio.gather(*runs), BOUND_S)

    results = asyncio.run(main())
    assert isinstance(results[2], StateError)
    for r in (results[0], results[1], results[3]):
        assert isinstance(r, StartError), r
        assert "no holder of layers 2-3" in str(r)  # the failed peer's own reason reached everyone


def test_a_peer_that_never_comes_is_named_after_the_barrier_wait(tmp_path):
    from potluck.peer.config import TrainerConfig
    from potluck.peer.errors import StartError
    from potluck.testbed.harness.p2p import keyed_group

    cfg = TrainerConfig(step_timeout_s=4.0, start_wait_s=2.0)
    splits = [(0, 2), (2, 3), (3, 4)]

    async def main():
        async with keyed_group(3, tmp_path) as nodes:
            boxes, _, trainers = await _trainers(
                nodes, 2, [[0], [1], [2]], splits, cfg, tmp_path
            )  # 2 never runs
            results = await asyncio.wait_for(
                asyncio.gather(*(_run(t, StartError) for t in trainers)), BOUND_S
            )
            return results, [b.take_suspects() for b in boxes[:2]], [b.peer_id for b in boxes]

    results, suspects, ids = asyncio.run(main())
    assert all(isinstance(r, StartError) for r in results), results
    assert ids[2] in str(results[0]) and ids[2] in str(results[1])
    # the leader names the absent peer for the coordinator to check, and so does the follower its no-go
    # reached (its report may be the one the coordinator reads first)
    assert suspects == [[ids[2]], [ids[2]]]


def test_a_no_go_names_only_peers_of_the_plan():
    from potluck.peer.train.barrier import _missing

    known = {"a", "b"}
    assert _missing(b'{"go": false, "reason": "x", "missing": ["a", "z", 3]}', known) == ["a"]
    for data in (b'{"go": false, "reason": "x"}', b'{"missing": "a"}', b"[]", b"not json"):
        assert _missing(data, known) == []


@pytest.mark.parametrize(
    "data",
    [b"", b"not json", b"[]", b'{"go": "yes", "reason": ""}', b'{"reason": ""}', b"{" + b" " * 5000 + b"}"],
)
def test_malformed_barrier_messages_are_refused(data):
    from potluck.peer.errors import StartError
    from potluck.peer.train.barrier import _parse

    with pytest.raises(StartError):
        _parse(data, "peer", "go")
