"""Serving state at a share of the uplink while training (transfer/pace.py): the pacer's clock, the
paced frame on a real stream pair, and the server's rate."""

import asyncio
import socket
import time

import pytest

from potluck.net.pace import SLICE_BYTES, Throttle, write_paced
from potluck.protocol.identity import Identity
from potluck.protocol.wire import Frame, MsgType, read_frame
from potluck.transfer.server import StateServer, TransferConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_pacer_spaces_reservations_at_the_rate_and_idle_time_earns_no_credit():
    clock, rate = Clock(), [1000.0]
    pacer = Throttle(lambda: rate[0], clock)
    assert pacer.reserve(500) == 0.0  # the first bytes go at once...
    assert pacer.reserve(500) == pytest.approx(0.5)  # ...the next when the first 500 B took their time
    assert pacer.reserve(1000) == pytest.approx(1.0)
    clock.now += 60.0  # a quiet minute
    assert pacer.reserve(2000) == 0.0
    assert pacer.reserve(1) == pytest.approx(2.0)  # no burst saved up from the quiet minute
    rate[0] = 4000.0  # the share changed: later reservations follow the new rate
    clock.now += 10.0
    assert pacer.reserve(4000) == 0.0 and pacer.reserve(1) == pytest.approx(1.0)


@pytest.mark.parametrize("rate", [None, 0.0, -1.0])
def test_without_a_rate_the_pacer_never_waits(rate):
    clock = Clock()
    pacer = Throttle(lambda: rate, clock)
    assert all(pacer.reserve(1 << 30) == 0.0 for _ in range(3))


async def paced_frame(payload: bytes, rate: float | None) -> tuple[Frame, float]:
    a, b = socket.socketpair()
    reader, keep = await asyncio.open_connection(sock=a)  # ``keep``: its socket lives while we read
    _, writer = await asyncio.open_connection(sock=b)
    try:
        t0 = time.monotonic()
        sent = asyncio.ensure_future(
            write_paced(writer, Frame(MsgType.STATE_CHUNK, payload), 10.0, Throttle(lambda: rate))
        )
        frame = await read_frame(reader, 10.0, expect={MsgType.STATE_CHUNK})
        await sent
        return frame, time.monotonic() - t0
    finally:
        writer.close()
        keep.close()


def test_a_paced_frame_arrives_whole_and_no_faster_than_the_rate():
    payload = bytes(range(256)) * (8 * SLICE_BYTES // 256)  # eight slices
    frame, took = asyncio.run(paced_frame(payload, 4 * SLICE_BYTES))  # four slices a second
    assert frame.payload == payload
    assert took >= 7 / 4 * 0.95  # the first slice at once, the other seven at the rate
    frame, _ = asyncio.run(paced_frame(b"", 1.0))
    assert frame.payload == b""


def test_the_server_serves_at_its_share_of_the_uplink_only_while_told_one():
    class Streams:
        peer_id = Identity.generate().peer_id

    identity = Identity.generate()
    Streams.peer_id = identity.peer_id
    uplink: list[float | None] = [8e6]
    server = StateServer(Streams(), "s", identity, TransferConfig(), uplink=lambda: uplink[0])  # type: ignore[arg-type]
    assert server.pacer.rate() == 0.5 * 8e6  # half by default
    uplink[0] = 1e5  # 0.8 Mbit/s: half would take a 1 MiB chunk past half the 10 s frame timeout
    assert server.pacer.rate() == pytest.approx((1 << 20) / 5.0)
    uplink[0] = None  # not training, or the uplink is unknown: full speed
    assert server.pacer.rate() is None
    whole = StateServer(Streams(), "s", identity, TransferConfig(serve_share=1.0), uplink=lambda: 8e6)  # type: ignore[arg-type]
    assert whole.pacer.rate() is None
    assert StateServer(Streams(), "s", identity, TransferConfig()).pacer.rate() is None  # type: ignore[arg-type]
    for share in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="serve_share"):
            TransferConfig(serve_share=share)
