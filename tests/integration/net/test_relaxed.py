"""Partial participation on real p2pd daemons: a late peer is dropped, a peer killed mid-round leaves
every survivor with the same renormalised mean."""

import asyncio
import random

import pytest
import torch

from potluck.net.config import TransportConfig
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Round
from potluck.peer.collectives.relaxed import LateError, relaxed_allreduce
from potluck.peer.config import AllReduceConfig, RelaxedConfig
from potluck.testbed.harness.p2p import p2p_group
from tests.integration.net.test_collectives import random_schedule

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


async def start_boxes(nodes):
    boxes = [Mailbox(node, "potluck/test/relaxed/1", TransportConfig(timeout_s=3)) for node in nodes]
    for box in boxes:
        await box.start()
    return boxes


def inputs_for(n, numel=40_000):
    gen = torch.Generator().manual_seed(5)
    return [torch.randn(numel, generator=gen) for _ in range(n)]


def test_late_peer_is_dropped_and_the_rest_agree():
    inputs = inputs_for(4)
    cfg = AllReduceConfig(chunk_elements=4000, timeout_s=3)
    relax = RelaxedConfig(deadline_s=1.0)

    async def main():
        async with p2p_group(4) as nodes:
            boxes = await start_boxes(nodes)
            sched = random_schedule([b.peer_id for b in boxes], 2, random.Random(1))

            async def late(box, x):
                await asyncio.sleep(2.5)  # ready long after the deadline
                return await relaxed_allreduce(box, sched, x, Round(0, 3), cfg, relax)

            runs = [
                relaxed_allreduce(b, sched, x, Round(0, 3), cfg, relax)
                for b, x in zip(boxes[:3], inputs[:3], strict=True)
            ]
            out = await asyncio.gather(*runs, late(boxes[3], inputs[3]), return_exceptions=True)
            for box in boxes:
                await box.close()
            return [b.peer_id for b in boxes], out

    peers, out = asyncio.run(main())
    assert isinstance(out[3], LateError), out[3]
    results = [o[0] for o in out[:3]]
    assert all(o[1] == tuple(peers[:3]) for o in out[:3])
    assert all(torch.equal(r, results[0]) for r in results)
    torch.testing.assert_close(results[0], torch.stack(inputs[:3]).mean(0), rtol=1e-5, atol=1e-6)


def test_peer_killed_mid_round_leaves_survivors_with_the_same_renormalised_mean():
    n = 5
    inputs = inputs_for(n, numel=400_000)
    cfg = AllReduceConfig(chunk_elements=2000, timeout_s=3)  # many chunks: the kill lands mid-round
    relax = RelaxedConfig(deadline_s=2.0, max_attempts=3)

    async def main():
        async with p2p_group(n) as nodes:
            boxes = await start_boxes(nodes)
            peers = [b.peer_id for b in boxes]
            sched = random_schedule(peers, 3, random.Random(7))
            # the victim relays for others in some tree, so its death cuts a reduction mid-flight
            victim = next(i for i in range(1, n) if any(t.children(peers[i], peers) for t in sched.trees))

            async def crash():
                task = asyncio.create_task(
                    relaxed_allreduce(boxes[victim], sched, inputs[victim], Round(0, 1), cfg, relax)
                )
                await asyncio.sleep(0.3)  # past the decision, inside the tree all-reduce
                task.cancel()
                await nodes[victim].shutdown()  # its daemon is gone: streams to it break
                return "killed"

            runs = [
                crash()
                if i == victim
                else relaxed_allreduce(boxes[i], sched, inputs[i], Round(0, 1), cfg, relax)
                for i in range(n)
            ]
            out = await asyncio.gather(*runs, return_exceptions=True)
            for i, box in enumerate(boxes):
                if i != victim:
                    await box.close()
            return peers, victim, out

    peers, victim, out = asyncio.run(main())
    survivors = [i for i in range(n) if i != victim]
    for i in survivors:
        assert not isinstance(out[i], BaseException), out[i]
    results = [out[i][0] for i in survivors]
    assert all(out[i][1] == tuple(peers[j] for j in survivors) for i in survivors)
    assert all(torch.equal(r, results[0]) for r in results)  # bit-for-bit agreement
    expected = torch.stack([inputs[i] for i in survivors]).mean(0)
    torch.testing.assert_close(results[0], expected, rtol=1e-5, atol=1e-6)
