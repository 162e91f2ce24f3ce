"""Hostile senders against a real mailbox (p2pd daemons on loopback): a peer outside the plan, floods of
far-future and empty messages, frames larger than the sender's share. Each is refused before it costs
the victim memory, and the victim's real traffic still arrives."""

import asyncio
import contextlib
import os

import pytest

from potluck.net.config import TransportConfig
from potluck.net.mailbox import MESSAGE_COST, Mailbox
from potluck.net.tags import Round, Stream, make_tag
from potluck.protocol.errors import WireError
from potluck.testbed.harness.p2p import p2p_group

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PROTO = "potluck/test/attacks/1"


async def boxes(nodes, cfg, **kw):
    out = [Mailbox(node, PROTO, cfg, **kw) for node in nodes]
    for box in out:
        await box.start()
    return out


def act(step: int, chunk: int = 0, epoch: int = 1):
    return make_tag(Round(epoch, step), Stream.ACTIVATIONS, chunk=chunk)


def test_a_peer_outside_the_plan_is_refused_and_its_buffered_messages_dropped():
    async def main():
        async with p2p_group(3) as nodes:
            victim, friend, stranger = await boxes(nodes, TransportConfig(timeout_s=3.0))
            await stranger.send(victim.peer_id, act(5), b"x" * 1000)  # before any plan: buffered
            await asyncio.sleep(0.3)
            assert victim._pending_bytes > 0
            await victim.admit({friend.peer_id})
            assert victim._pending_bytes == 0  # the stranger's message went with its admission
            # the stranger's streams are closed unread: nothing lands, however often it opens another
            for i in range(50):
                with contextlib.suppress(WireError):
                    await stranger.send(victim.peer_id, act(6, i), b"y" * 1000)
                await asyncio.sleep(0.05)
            assert victim._pending_bytes == 0 and victim.refused >= 1
            await friend.send(victim.peer_id, act(6), b"real")
            assert await victim.recv(friend.peer_id, act(6)) == b"real"
            for b in (victim, friend, stranger):
                await b.close()

    asyncio.run(main())


def test_a_newer_plans_peer_is_vouched_for():
    async def main():
        async with p2p_group(2) as nodes:
            asked = []

            async def vouch(peer):
                asked.append(peer)
                return True

            victim = Mailbox(nodes[0], PROTO, TransportConfig(timeout_s=3.0), vouch=vouch)
            await victim.start()
            (joiner,) = await boxes(nodes[1:], TransportConfig(timeout_s=3.0))
            await victim.admit(set())
            await joiner.send(victim.peer_id, act(1), b"hello")
            assert await victim.recv(joiner.peer_id, act(1)) == b"hello"
            assert asked == [joiner.peer_id]
            await victim.close()
            await joiner.close()

    asyncio.run(main())


@pytest.mark.parametrize("newer", [True, False])
def test_a_message_of_a_newer_plan_waits_for_the_receiver_to_read_that_plan(newer):
    """Seen in the churn benchmark: a peer of a new plan sent its start-barrier READY before the plan's
    leader had read the plan; the leader closed the stream unread and the plan stalled 37 s at its
    barrier; and a spare, whose step stayed where it last trained, refused such a READY as "too far
    ahead". A message for a newer epoch, at any step, is now held until the receiver admits its sender
    (within ``timeout_s``); one for the receiver's own epoch from a peer outside its plan is refused."""

    async def main():
        async with p2p_group(3) as nodes:
            victim, friend, joiner = await boxes(nodes, TransportConfig(timeout_s=3.0))
            victim.advance(1, 0)  # a spare's step stays where it last trained
            await victim.admit({friend.peer_id})  # plan epoch 1 without the joiner
            tag = act(1000, epoch=2) if newer else act(0, epoch=1)  # the new plan starts at step 1000
            await joiner.send(victim.peer_id, tag, b"ready")  # it read plan epoch 2 first
            await asyncio.sleep(0.5)
            victim.advance(*((2, 1000) if newer else (1, 0)))  # it reads plan epoch 2, from step 1000
            await victim.admit({friend.peer_id, joiner.peer_id})  # the victim reads plan epoch 2
            try:
                got = await victim.recv(joiner.peer_id, tag, 3.0)
            except WireError:
                got = None
            for b in (victim, friend, joiner):
                await b.close()
            return got

    assert asyncio.run(main()) == (b"ready" if newer else None)


def test_a_newer_plans_message_is_kept_whatever_its_step():
    """Seen in the churn benchmark: a spare, its step still where it last trained (461), refused the
    start-barrier READY (step 1087) of the plan that placed it as "too far ahead", and the plan stalled
    at its barrier. The step bound holds within this peer's epoch; a newer one may start anywhere."""

    async def main():
        async with p2p_group(2) as nodes:
            victim, friend = await boxes(nodes, TransportConfig(timeout_s=3.0))
            victim.advance(1, 461)
            await victim.admit({friend.peer_id})
            await friend.send(victim.peer_id, act(1087, epoch=2), b"ready")  # the next plan's start
            await friend.send(victim.peer_id, act(1087, epoch=1), b"ahead")  # this plan, too far ahead
            await asyncio.sleep(0.5)
            victim.advance(2, 1087)
            got = await victim.recv(friend.peer_id, act(1087, epoch=2), 3.0)
            refused = victim.refused
            for b in (victim, friend):
                await b.close()
            return got, refused

    assert asyncio.run(main()) == (b"ready", 1)


def test_far_future_messages_are_refused_and_the_stream_keeps_working():
    async def main():
        async with p2p_group(2) as nodes:
            victim, peer = await boxes(nodes, TransportConfig(timeout_s=3.0))
            await victim.admit({peer.peer_id})
            victim.advance(epoch=1, step=10)
            for i in range(200):  # 200 x 64 KiB for step 10^6: never stored
                await peer.send(victim.peer_id, act(1_000_000, i), os.urandom(64 << 10))
            await peer.send(victim.peer_id, act(10, 0, epoch=99), b"far epoch")
            await peer.send(victim.peer_id, act(11), b"next step")  # within the window: kept
            assert await victim.recv(peer.peer_id, act(11)) == b"next step"
            assert victim._pending_bytes == 0 and victim.refused == 201
            await victim.close()
            await peer.close()

    asyncio.run(main())


def test_empty_messages_count_against_the_senders_share():
    async def main():
        async with p2p_group(3) as nodes:
            cfg = TransportConfig(timeout_s=2.0, max_pending_bytes=4 << 20, max_pending_per_sender=1 << 20)
            victim, flooder, honest = await boxes(nodes, cfg)
            await victim.admit({flooder.peer_id, honest.peer_id})
            victim.advance(epoch=1, step=0)
            share = cfg.max_pending_per_sender // MESSAGE_COST  # empty messages the share holds

            with contextlib.suppress(WireError):  # 29 bytes each: the flood may end before the drop lands
                for i in range(4 * share):
                    await flooder.send(victim.peer_id, act(0, i), b"")
            await asyncio.sleep(2 * cfg.timeout_s)  # its share stays full: its stream is dropped
            assert victim.refused == 1
            assert victim._held[flooder.peer_id] <= cfg.max_pending_per_sender
            assert victim._pending_bytes <= cfg.max_pending_per_sender
            big = os.urandom(900 << 10)  # the honest sender still has its own share for real work
            await honest.send(victim.peer_id, act(0), big)
            assert await victim.recv(honest.peer_id, act(0)) == big
            for b in (victim, flooder, honest):
                await b.close()

    asyncio.run(main())


def test_a_frame_larger_than_the_share_is_not_read():
    async def main():
        async with p2p_group(2) as nodes:
            cfg = TransportConfig(timeout_s=2.0, max_pending_per_sender=1 << 20)
            victim, peer = await boxes(nodes, cfg)
            with pytest.raises(WireError):
                for i in range(20):
                    await peer.send(victim.peer_id, act(0, i), bytes(4 << 20))
            assert victim.bytes_received == 0 and victim._pending_bytes == 0
            await victim.close()
            await peer.close()

    asyncio.run(main())
