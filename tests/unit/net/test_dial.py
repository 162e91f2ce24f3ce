"""Dialing a peer: the daemon's route first, then every announced address, with backoff, within one
timeout; a peer that cannot be reached becomes a mailbox suspect."""

import asyncio
import time
from types import SimpleNamespace

import pytest

from potluck.net import dial
from potluck.net.config import TransportConfig
from potluck.net.dial import backoff_s, dial_addresses, open_stream
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Round, Stream, make_tag
from potluck.protocol.errors import WireError
from potluck.protocol.identity import Identity

PEER = Identity.generate().peer_id
RELAY = Identity.generate().peer_id


class FakeP2P:
    """A daemon with no route to ``PEER`` until ``connect`` is given an address it can dial."""

    def __init__(self, dialable: set[str]) -> None:
        self.peer_id = SimpleNamespace(to_base58=lambda: "me")
        self.dialable, self.routed = dialable, False
        self.opens, self.connects = 0, []
        self._client = self

    async def connect(self, peer_id, maddrs):
        self.connects.append([str(m) for m in maddrs])
        if not any(str(m) in self.dialable for m in maddrs):
            raise ConnectionError("failed to dial: all dials failed")
        self.routed = True

    async def call_binary_stream_handler(self, peer_id, protocol):
        self.opens += 1
        if not self.routed:
            raise ConnectionError("Connect failed. msg=routing: not found")
        return None, asyncio.StreamReader(), SimpleNamespace(is_closing=lambda: False, close=lambda: None)


def test_dial_addresses_strip_the_peer_id_and_keep_relay_circuits():
    circuit = f"/ip4/10.0.0.9/tcp/4001/p2p/{RELAY}/p2p-circuit"
    got = dial_addresses(
        [
            f"/ip4/127.0.0.1/tcp/1/p2p/{PEER}",
            "/ip4/127.0.0.1/tcp/2",
            f"/ip4/127.0.0.1/tcp/1/p2p/{PEER}",  # duplicate
            "/not-a-protocol/x",  # malformed: skipped, not fatal
            f"{circuit}/p2p/{PEER}",
        ],
        PEER,
    )
    assert [str(m) for m in got] == ["/ip4/127.0.0.1/tcp/1", "/ip4/127.0.0.1/tcp/2", circuit]


def test_backoff_doubles_with_jitter_up_to_a_cap():
    for attempt, base in [(1, 0.2), (2, 0.4), (3, 0.8), (4, 1.6), (5, 2.0), (9, 2.0)]:
        assert 0.8 * base <= backoff_s(attempt) <= 1.2 * base


def test_a_peer_the_daemon_cannot_route_is_dialed_at_its_announced_addresses():
    live = "/ip4/127.0.0.1/tcp/2"
    p2p = FakeP2P({live})

    async def addresses(peer):
        assert peer == PEER
        return [f"/ip4/127.0.0.1/tcp/1/p2p/{PEER}", f"{live}/p2p/{PEER}"]  # a dead port first

    asyncio.run(open_stream(p2p, PEER, "proto/1", 5.0, addresses))  # type: ignore[arg-type]
    assert p2p.opens == 2 and p2p.connects == [["/ip4/127.0.0.1/tcp/1", live]]


def test_a_dial_retries_with_backoff_until_an_address_works(monkeypatch):
    monkeypatch.setattr(dial, "FIRST_BACKOFF_S", 0.01)
    p2p = FakeP2P(set())
    calls = 0

    async def addresses(peer):
        nonlocal calls
        calls += 1
        if calls == 3:  # the peer's next heartbeat announces an address that works
            p2p.dialable.add("/ip4/127.0.0.1/tcp/3")
            return ["/ip4/127.0.0.1/tcp/3"]
        return ["/ip4/127.0.0.1/tcp/1"]

    asyncio.run(open_stream(p2p, PEER, "proto/1", 5.0, addresses))  # type: ignore[arg-type]
    assert calls == 3 and len(p2p.connects) == 3 and p2p.routed


def test_a_dial_gives_up_at_its_timeout_and_the_mailbox_suspects_the_peer(monkeypatch):
    monkeypatch.setattr(dial, "FIRST_BACKOFF_S", 0.01)
    monkeypatch.setattr(dial, "MAX_BACKOFF_S", 0.05)

    async def addresses(peer):
        return ["/ip4/127.0.0.1/tcp/1"]

    async def main():
        box = Mailbox(FakeP2P(set()), "proto/1", TransportConfig(timeout_s=0.5), addresses=addresses)  # type: ignore[arg-type]
        t = time.monotonic()
        with pytest.raises(
            # the last attempt fails on its own or is cut by the deadline on a loaded machine
            WireError,
            match=rf"cannot open a stream to {PEER} \(\d+ attempts in 0.5 s\): (failed|TimeoutError)",
        ):
            await box.send(PEER, make_tag(Round(1, 0), Stream.ACTIVATIONS), b"x")
        assert time.monotonic() - t < 1.0  # bounded by the mailbox's timeout
        with pytest.raises(WireError, match="no message"):
            await box.recv("other", make_tag(Round(1, 0), Stream.ACTIVATIONS), 0.01)
        assert box.take_suspects() == ["other", PEER]  # most recent first
        assert box.take_suspects() == []  # taken

    asyncio.run(main())
