"""Does this node's circuit relay carry bulk data? A self-test run when a node serves as a relay.

hivemind 1.1.12's p2pd, with relaying on, starts two circuit-relay services on one host: one with its
``-relayDataLimit`` / ``-relayTimeLimit`` flags (4 GiB, 30 min) and one from ``EnableRelayV2`` with
go-libp2p's defaults (128 KiB, 2 min). Whichever registers the hop protocol last serves every circuit,
and when the node forces public reachability the two race at start-up. Measured in the WAN testbed,
about one start in three serves circuits that are cut after ~100 KB (docs/benchmarks.md, "Home NAT"):
fine for a commit message, fatal for a gradient shard. The race cannot be seen through p2pd's API, so a
node that will relay tries its own relay: a throwaway NATed daemon reserves a slot on it, another sends
it ``nbytes`` through the circuit, and the node's p2pd is restarted by the caller when that fails.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from typing import Any, cast

from hivemind.p2p import P2P
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
from hivemind.utils.multiaddr import Multiaddr

from potluck.net.maddrs import WireMaddr

logger = logging.getLogger(__name__)

PROTOCOL = "potluck/relay-check/1"
CHECK_BYTES = 512 << 10  # > 4x go-libp2p's default 128 KiB circuit limit
CHUNK = 64 << 10


def pick_address(maddrs: list[str]) -> str | None:
    """The relay's address the throwaway daemons dial: loopback when it listens there (always local),
    else its first TCP address (the testbed's namespace address is local too)."""
    tcp = [m for m in maddrs if "/tcp/" in m and "/p2p/" in m and "/p2p-circuit" not in m]
    loop = [m for m in tcp if m.startswith("/ip4/127.")]
    return (loop or tcp or [""])[0] or None


async def relay_serves_bulk(
    relay: P2P, spawn: Any, nbytes: int = CHECK_BYTES, timeout_s: float = 20.0
) -> bool | None:
    """Whether ``nbytes`` cross ``relay``'s circuit relay intact within ``timeout_s``; None when the
    test could not run (no usable address, the helpers did not start). ``spawn(kwargs, extra_args)``
    starts a throwaway P2P daemon (``net/node.py`` passes its own, so they die with this process)."""
    addr = pick_address([str(m) for m in await relay.get_visible_maddrs()])
    if addr is None:
        return None
    ip = Multiaddr(addr).value_for_protocol("ip4")
    here = [f"/ip4/{ip}/tcp/0"]
    deadline = time.monotonic() + timeout_s
    target = sender = None
    try:
        target = await spawn(
            dict(
                host_maddrs=here,
                force_reachability="private",
                use_auto_relay=True,
                trusted_relays=[addr],
                auto_nat=False,
                nat_port_map=False,
            ),
            ("-relayDiscovery=false",),
        )
        sender = await spawn(dict(host_maddrs=here, auto_nat=False, nat_port_map=False), ())
    except Exception as e:  # no second daemon here: say so, do not fail the node
        logger.info("relay self-test could not start its helpers: %s", e)
        for p in (target, sender):
            if p is not None:
                await p.shutdown()
        return None

    async def sink(info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = 0
        try:
            while n < nbytes:
                block = await reader.read(CHUNK)
                if not block:
                    break
                n += len(block)
            writer.write(struct.pack("<Q", n))
            await writer.drain()
        finally:
            writer.close()

    try:
        await target.add_binary_stream_handler(PROTOCOL, sink)
        circuit = cast(Multiaddr, WireMaddr(addr + "/p2p-circuit"))
        while True:  # the target's reservation takes a moment
            try:
                left = deadline - time.monotonic()
                await asyncio.wait_for(sender._client.connect(target.peer_id, [circuit]), max(left, 0.1))
                break
            except Exception as e:
                if time.monotonic() + 0.5 >= deadline:
                    logger.info("relay self-test: no circuit through this node: %s", str(e)[-200:])
                    return False
                await asyncio.sleep(0.5)
        _, reader, writer = await asyncio.wait_for(
            sender.call_binary_stream_handler(target.peer_id, PROTOCOL), max(deadline - time.monotonic(), 0.1)
        )
        try:
            for off in range(0, nbytes, CHUNK):
                writer.write(bytes(min(CHUNK, nbytes - off)))
                await writer.drain()
            answer = await asyncio.wait_for(reader.readexactly(8), max(deadline - time.monotonic(), 0.1))
        finally:
            writer.close()
        (received,) = struct.unpack("<Q", answer)
        return bool(received == nbytes)
    except Exception as e:  # reset mid-transfer: the short-limit relay serves
        logger.info("relay self-test: the transfer failed: %s", str(e)[-200:])
        return False
    finally:
        await target.shutdown()
        await sender.shutdown()
