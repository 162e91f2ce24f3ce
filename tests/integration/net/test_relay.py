"""NAT traversal over real p2pd daemons on loopback: a node behind a (declared) NAT reserves a slot on a
relaying node and announces circuits through it; a node that knows nothing else of it reaches it there
and sends it 1 MiB intact (8x what p2pd's default relay service lets through). On loopback libp2p may
upgrade the connection to a direct one once it is up, so which path carried the bytes is not asserted
here; the WAN testbed's NAT tests are where nothing but the relay can."""

import asyncio

import pytest

from potluck.net.config import NetworkConfig
from potluck.net.dial import open_stream
from potluck.net.links import CIRCUIT
from potluck.net.node import SwarmNode
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.identity import Identity

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

LOOPBACK = ("/ip4/127.0.0.1/tcp/0",)
NBYTES = 1 << 20  # 8x the 128 KiB a default circuit carries


async def _scenario() -> None:
    owner = Identity.generate()
    policy = TrustPolicy("relay-test", owner.public_key)
    relay_net = NetworkConfig(host_maddrs=LOOPBACK, reachability="public", bootstrap_timeout_s=10.0)
    relay = await SwarmNode.start(Identity.generate(), policy, relay_net)
    nodes = [relay]
    try:
        boot = [a for a in await relay.visible_maddrs() if "/tcp/" in a]
        natted_net = NetworkConfig(host_maddrs=LOOPBACK, reachability="private", bootstrap_timeout_s=10.0)
        natted = await SwarmNode.start(Identity.generate(), policy, natted_net, boot)
        nodes.append(natted)
        assert natted.behind_nat and natted.circuits
        announced = await natted.visible_maddrs()
        assert announced[: len(natted.circuits)] == natted.circuits and all(
            CIRCUIT in c for c in natted.circuits
        )
        # A lone node (no DHT in common): all it knows of the NATed one is the circuit it announces.
        other = await SwarmNode.start(Identity.generate(), policy, NetworkConfig(host_maddrs=LOOPBACK))
        nodes.append(other)

        received: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def sink(info, reader, writer):
            n = 0
            while n < NBYTES and (block := await reader.read(1 << 16)):
                n += len(block)
            writer.close()
            received.set_result(n)

        await natted.p2p.add_binary_stream_handler("relay-test/1", sink)

        async def circuits_only(peer: str) -> list[str]:  # as if its direct addresses were unreachable
            return natted.circuits

        _, writer = await open_stream(
            other.p2p, natted.identity.peer_id, "relay-test/1", 30.0, addresses=circuits_only
        )
        for _ in range(NBYTES // (1 << 16)):
            writer.write(bytes(1 << 16))
            await writer.drain()
        assert await asyncio.wait_for(received, 30.0) == NBYTES
        writer.close()
    finally:
        for node in reversed(nodes):
            await node.shutdown()


def test_a_natted_node_is_reached_through_its_relay_with_bulk_intact() -> None:
    # One fresh retry, only for a stream reset mid-bulk: about 1 run in 5 on the loaded 2-core box
    # (2026-11-25, after 4 clean sessions) the circuit's stream was reset, plausibly when libp2p swaps
    # the relayed connection for a direct one on loopback (see the module docstring); not yet explained.
    # Two resets in a row, or any other failure, still fail the test.
    try:
        asyncio.run(_scenario())
    except ConnectionResetError:
        asyncio.run(_scenario())
