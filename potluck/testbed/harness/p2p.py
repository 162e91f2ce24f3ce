"""In-process libp2p daemons on loopback for transport and collective tests (port 0, reaped on exit)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from hivemind.p2p import P2P

from potluck.net.node import p2pd_dies_with_this_process
from potluck.protocol.identity import Identity
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


@asynccontextmanager
async def keyed_group(n: int, key_dir: Path) -> AsyncIterator[list[tuple[P2P, Identity]]]:
    """``n`` connected daemons, each running under an Ed25519 identity the test can sign with."""
    nodes: list[tuple[P2P, Identity]] = []
    try:
        for i in range(n):
            identity = Identity.generate()
            key = identity.write_libp2p_key(key_dir / f"peer{i}.p2pkey")
            maddrs = [str(m) for p2p, _ in nodes for m in await p2p.get_visible_maddrs()]
            with p2pd_dies_with_this_process():
                p2p = await P2P.create(
                    initial_peers=maddrs or None,
                    host_maddrs=[LOOPBACK],
                    nat_port_map=False,
                    auto_nat=False,
                    identity_path=str(key),
                    check_if_identity_free=False,
                )
            nodes.append((p2p, identity))
        yield nodes
    finally:
        for p2p, _ in nodes:
            if p2p.is_alive:
                await p2p.shutdown()
