"""In-process libp2p daemons on loopback for transport and collective tests (port 0, reaped on exit)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from hivemind.p2p import P2P

from potluck.net.node import p2pd_dies_with_this_process
from potluck.testbed.localswarm import LOOPBACK


@asynccontextmanager
async def p2p_group(n: int) -> AsyncIterator[list[P2P]]:
    """``n`` p2pd daemons, each bootstrapped to all earlier ones so every pair is connected."""
    nodes: list[P2P] = []
    try:
        for _ in range(n):
            maddrs = [str(m) for node in nodes for m in await node.get_visible_maddrs()]
            with p2pd_dies_with_this_process():  # a killed test run leaves no p2pd behind
                nodes.append(
                    await P2P.create(
                        initial_peers=maddrs or None,
                        host_maddrs=[LOOPBACK],
                        nat_port_map=False,
                        auto_nat=False,
                    )
                )
        yield nodes
    finally:
        for node in nodes:
            await node.shutdown()
