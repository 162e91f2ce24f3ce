"""Pushed records (``net/push.py``) between two real p2pd daemons on loopback: a plan the coordinator
pushes arrives verified; a forged, oversized or unasked-for push is dropped before it is used."""

from __future__ import annotations

import asyncio

import pytest
from hivemind.utils import get_dht_time

from potluck.net import push
from potluck.net.config import NetworkConfig
from potluck.net.node import SwarmNode
from potluck.protocol import envelope
from potluck.protocol.envelope import TrustPolicy, Verified
from potluck.protocol.identity import Identity
from potluck.protocol.training import StageAssignment, TrainPlan
from potluck.protocol.wire import HEADER, MAGIC, MAX_PAYLOAD, VERSION, MsgType
from potluck.testbed.localswarm import LOOPBACK

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SWARM = "push-test"


def plan(epoch: int, peer: str) -> TrainPlan:
    stages = [StageAssignment(first_layer=0, last_layer=2, peers=[peer])]
    return TrainPlan(job="j", epoch=epoch, start_step=0, micro_batches=1, issued_at=1.0, stages=stages)


def test_a_pushed_plan_arrives_verified_and_bad_pushes_are_dropped():
    coordinator, stranger = Identity.generate(), Identity.generate()
    policy = TrustPolicy(SWARM, coordinator.public_key)
    net = NetworkConfig(host_maddrs=(LOOPBACK,), bootstrap_timeout_s=30.0)

    async def main() -> list[Verified]:
        got: list[Verified] = []
        arrived = asyncio.Event()

        async def take(v: Verified) -> None:
            got.append(v)
            arrived.set()

        a = await SwarmNode.start(coordinator, policy, net)
        b = await SwarmNode.start(Identity.generate(), policy, net, await a.visible_maddrs())
        try:
            await b.take_pushes(lambda: ["plan"], take)
            me = b.identity.peer_id
            assert await a.publish("plan", plan(1, me), 60.0, push_to=[me])
            await asyncio.wait_for(arrived.wait(), 10.0)
            arrived.clear()
            # signed by a key that is not the coordinator's: refused as a DHT read would refuse it
            exp = get_dht_time() + 60.0
            forged = envelope.seal(stranger, SWARM, "plan", plan(9, me), exp)
            assert await push.push(a.streams, SWARM, [me], "plan", exp, forged) == 1
            # a record of a name this peer does not take pushed (signed by the coordinator)
            other = envelope.seal(coordinator, SWARM, "plan", plan(8, me), exp)
            assert await push.push(a.streams, SWARM, [me], "bans", exp, other) == 1
            # a frame longer than a record may be: dropped from its header, before its body is read
            _, writer = await a.streams.open(me, push.push_protocol(SWARM), 5.0)
            writer.write(HEADER.pack(MAGIC, VERSION, int(MsgType.RECORD), 0, MAX_PAYLOAD[MsgType.RECORD] + 1))
            await writer.drain()
            writer.close()
            # a value over the swarm's record limit in a frame that fits: refused by the check of a read
            big = envelope.seal(coordinator, SWARM, "plan", plan(7, me), exp) + b"\0" * policy.max_value_bytes
            assert await push.push(a.streams, SWARM, [me], "plan", exp, big) == 1
            # then a good one again: only it arrives
            assert await a.publish("plan", plan(2, me), 60.0, push_to=[me])
            await asyncio.wait_for(arrived.wait(), 10.0)
            await asyncio.sleep(0.5)
        finally:
            await b.shutdown()
            await a.shutdown()
        return got

    got = asyncio.run(main())
    assert [v.record.epoch for v in got if isinstance(v.record, TrainPlan)] == [1, 2]
    assert all(v.name == "plan" and v.public_key == coordinator.public_key for v in got)
