"""The publisher never holds a peer up: a bounded queue that drops the oldest, retained messages that a
newer one supersedes, and a dead broker that costs nothing but dropped metrics."""

import asyncio
import socket
import time

from potluck.telemetry.config import MqttTarget, PublisherConfig
from potluck.telemetry.publisher import Outgoing, Publisher


def test_a_full_queue_drops_its_oldest_and_never_blocks():
    pub = Publisher(MqttTarget("127.0.0.1", 1), "c", cfg=PublisherConfig(queue_size=3))
    for i in range(10):
        pub.send(Outgoing("t/m", str(i).encode()))
    assert pub.pending == 3 and pub.dropped == 7
    assert [m.payload for m in pub._queue] == [b"7", b"8", b"9"]
    pub.send(Outgoing("t/s", b"old", retain=True))
    pub.send(Outgoing("t/s", b"new", retain=True))
    assert pub._retained["t/s"].payload == b"new"  # re-sent after every reconnect: only the newest


def test_a_dead_broker_is_retried_with_backoff_while_sends_return_at_once():
    with socket.socket() as s:  # a port nobody listens on (bound, then closed)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = PublisherConfig(queue_size=8, connect_timeout_s=0.5, first_backoff_s=0.05, max_backoff_s=0.2)
    pub = Publisher(MqttTarget("127.0.0.1", port), "c", cfg=cfg)

    async def main() -> float:
        task = asyncio.create_task(pub.run())
        t0 = time.perf_counter()
        for i in range(1000):
            pub.send(Outgoing("t/m", b"x" * 100))
            if i % 100 == 0:
                await asyncio.sleep(0.05)
        spent = time.perf_counter() - t0
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return spent

    asyncio.run(main())
    assert not pub.connected and pub.sent == 0
    assert pub.pending == 8 and pub.dropped == 992  # memory stays bounded however long the broker is away
