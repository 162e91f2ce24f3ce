"""The peer mailbox over real p2pd daemons on loopback (one process, port 0)."""

import asyncio
import contextlib
import os
import time

import pytest

from potluck.net.config import TransportConfig
from potluck.net.mailbox import Mailbox
from potluck.net.tags import RoundSpan, Tag
from potluck.protocol.errors import WireError
from potluck.testbed.harness.p2p import p2p_group

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PROTO = "potluck/test/mailbox/1"


async def delivered(a: Mailbox, b: Mailbox, tag: Tag, payload: bytes) -> bytes | None:
    """What ``b`` receives of ``payload`` sent by ``a`` under ``tag`` within 3 s (None: lost)."""
    try:
        await a.send(b.peer_id, tag, payload)
        return await b.recv(a.peer_id, tag, 3.0)
    except WireError:
        return None


async def outcome(wait: asyncio.Task, t0: float) -> tuple[str, float]:
    """("delivered", or the wait's error) and the seconds since ``t0`` when it ended."""
    try:
        await wait
        why = "delivered"
    except WireError as e:
        why = str(e)
    return why, time.monotonic() - t0


async def mailboxes(nodes, cfg=TransportConfig(timeout_s=5.0)):
    boxes = [Mailbox(node, PROTO, cfg) for node in nodes]
    for box in boxes:
        await box.start()
    return boxes


def test_tagged_messages_between_three_peers():
    async def main():
        async with p2p_group(3) as nodes:
            a, b, c = await mailboxes(nodes)
            big = os.urandom(3 << 20)
            # sends that arrive before anyone waits are buffered under (sender, tag)
            await a.send(c.peer_id, Tag(1, 0, 0), b"from-a")
            await b.send(c.peer_id, Tag(1, 0, 0), b"from-b")
            await a.send(c.peer_id, Tag(1, 2, 7, 1), big)
            await a.send(c.peer_id, Tag(1, 0, 1), b"")
            assert await c.recv(b.peer_id, Tag(1, 0, 0)) == b"from-b"
            assert await c.recv(a.peer_id, Tag(1, 0, 0)) == b"from-a"
            assert await c.recv(a.peer_id, Tag(1, 2, 7, 1)) == big
            assert await c.recv(a.peer_id, Tag(1, 0, 1)) == b""
            # a receive posted before the send completes when the message lands
            waiting = asyncio.create_task(a.recv(c.peer_id, Tag(2)))
            await asyncio.sleep(0.05)
            await c.send(a.peer_id, Tag(2), b"late")
            assert await waiting == b"late"
            # messages to oneself need no stream
            await b.send(b.peer_id, Tag(3), b"self")
            assert await b.recv(b.peer_id, Tag(3)) == b"self"
            assert a.bytes_sent == len(big) + len(b"from-a")
            for box in (a, b, c):
                await box.close()

    asyncio.run(main())


def test_missing_message_times_out_and_dead_peer_fails_fast():
    async def main():
        async with p2p_group(2) as nodes:
            a, b = await mailboxes(nodes, TransportConfig(timeout_s=2.0))
            start = time.monotonic()
            with pytest.raises(WireError, match="no message"):
                await a.recv(b.peer_id, Tag(9), timeout_s=0.5)
            assert time.monotonic() - start < 2.0
            dead = b.peer_id
            await b.close()
            await nodes[1].shutdown()
            start = time.monotonic()
            with pytest.raises(WireError):
                await a.send(dead, Tag(1), b"x")
                await a.send(dead, Tag(2), b"y")  # a cached stream may accept one write before failing
            assert time.monotonic() - start < 10.0
            await a.close()

    asyncio.run(main())


def test_pending_bytes_are_bounded_with_backpressure():
    async def main():
        async with p2p_group(2) as nodes:
            cfg = TransportConfig(timeout_s=10.0, max_pending_bytes=1 << 20)
            a, b = await mailboxes(nodes, cfg)
            chunk = os.urandom(400 << 10)
            sends = asyncio.ensure_future(
                asyncio.gather(*(a.send(b.peer_id, Tag(1, 0, i), chunk) for i in range(6)))
            )
            await asyncio.sleep(1.0)
            assert b._pending_bytes <= cfg.max_pending_bytes  # at most 2 of the 6 chunks buffered
            got = [await b.recv(a.peer_id, Tag(1, 0, i)) for i in range(6)]
            await sends
            assert got == [chunk] * 6
            assert await b.forget(RoundSpan(0, 2)) == 0  # rounds 0 and 1: every message was claimed
            await a.close()
            await b.close()

    asyncio.run(main())


async def _no_watch(*_args) -> None:
    return None


@pytest.mark.parametrize(
    "reopen,watch", [(True, False), (False, True), (False, False)], ids=["reopen", "watch", "neither"]
)
def test_a_message_after_a_long_silence_is_not_lost(monkeypatch, reopen, watch):
    """Measured in the churn benchmark: after a re-plan, a peer wrote activations into a stream its
    partner had closed for being idle (10 x timeout_s); the write succeeded locally, the message never
    arrived, and the pipeline deadlocked until the step timeout. Two guards, each enough alone: a sender
    opens a fresh stream after 4 x timeout_s of silence (``reopen``), and drops an outgoing stream as
    soon as its receiver closes it (``watch``); without either the message is lost (``neither``)."""
    import potluck.net.mailbox.box as mailbox

    if not reopen:
        monkeypatch.setattr(mailbox, "REOPEN_AFTER_IDLE", 10**6)
    if not watch:
        monkeypatch.setattr(mailbox.Mailbox, "_watch", _no_watch)
    monkeypatch.setattr(mailbox, "IDLE_CLOSE", 3)

    async def main() -> bytes | None:
        async with p2p_group(2) as nodes:
            a, b = await mailboxes(nodes, TransportConfig(timeout_s=0.5))
            await a.send(b.peer_id, Tag(1), b"first")
            assert await b.recv(a.peer_id, Tag(1)) == b"first"
            await asyncio.sleep(2.5)  # b closed the idle stream after 1.5 s
            got = await delivered(a, b, Tag(2), b"after the silence")
            for box in (a, b):
                await box.close()
            return got

    got = asyncio.run(main())
    if reopen or watch:
        assert got == b"after the silence"
    else:
        assert got is None


@pytest.mark.parametrize("watch", [True, False])
def test_a_stream_refused_while_not_admitted_is_not_reused(monkeypatch, watch):
    """Measured in the churn benchmark: a spare still sent a message to a peer whose plan did not hold
    it; that peer closed the stream unread. When the next plan placed the spare, its start-barrier READY
    went into the same stream, was lost, and the plan hung for 40 s. The sender now drops a stream as
    soon as its receiver closes it (``watch=False`` shows the loss)."""
    import potluck.net.mailbox.box as mailbox

    if not watch:
        monkeypatch.setattr(mailbox.Mailbox, "_watch", _no_watch)

    async def main() -> bytes | None:
        async with p2p_group(3) as nodes:
            a, b, c = await mailboxes(nodes, TransportConfig(timeout_s=1.0))
            await a.send(b.peer_id, Tag(1), b"first")
            assert await b.recv(a.peer_id, Tag(1)) == b"first"
            await b.admit({c.peer_id})  # a new plan without a
            await a.send(b.peer_id, Tag(2), b"refused")  # b closes a's stream unread
            await asyncio.sleep(1.0)
            await b.admit({a.peer_id, c.peer_id})  # the next plan places a again
            got = await delivered(a, b, Tag(3), b"ready")
            for box in (a, b, c):
                await box.close()
            return got

    got = asyncio.run(main())
    assert got == (b"ready" if watch else None)


@pytest.mark.parametrize("wait_first", [True, False], ids=["waiting", "wait-after-the-end"])
def test_a_dead_senders_waits_fail_as_soon_as_its_stream_ends(wait_first: bool):
    """A killed process's streams end at once; the receiver checks whether the sender still accepts a
    connection and, when it does not, fails the waits on it then instead of after their timeout. A wait
    that begins only after the stream ended (a step's leader asking for a READY its dead peer never
    sent) is checked as it begins."""

    async def main() -> tuple[str, float]:
        async with p2p_group(2) as nodes:
            maddrs = {n.peer_id.to_base58(): [str(m) for m in await n.get_visible_maddrs()] for n in nodes}

            async def book(peer: str) -> list[str]:
                return maddrs.get(peer, [])

            a, b = (Mailbox(n, PROTO, TransportConfig(timeout_s=30.0), addresses=book) for n in nodes)
            for box in (a, b):
                await box.start()
            await a.send(b.peer_id, Tag(1), b"hello")  # a's stream to b is open
            assert await b.recv(a.peer_id, Tag(1)) == b"hello"
            if wait_first:
                waiting = asyncio.create_task(b.recv(a.peer_id, Tag(2), 30.0))
                await asyncio.sleep(0.2)
            t0 = time.monotonic()
            await nodes[0].shutdown()  # a's daemon dies: its connections are reset
            if not wait_first:
                await asyncio.sleep(1.0)  # b sees the stream end with nobody waiting on a
                t0 = time.monotonic()
                waiting = asyncio.create_task(b.recv(a.peer_id, Tag(2), 30.0))
            why, elapsed = await outcome(waiting, t0)
            assert a.peer_id in b.take_suspects()
            # The verdict stands for a while: the next wait on a (a step's commit vote after its
            # pipeline wait failed) and a send to it (the commit decision) fail at once, with no second
            # check and no dial (churn run Q: 4.7 s and 5 s more on a peer already found dead).
            t1 = time.monotonic()
            again, _ = await outcome(asyncio.create_task(b.recv(a.peer_id, Tag(3), 30.0)), t1)
            sent = await b.send_quietly(a.peer_id, Tag(4), b"decision")
            assert "is gone" in again and sent is not None and "is gone" in sent, (again, sent)
            assert time.monotonic() - t1 < 0.5
            assert a.peer_id in b.take_suspects()
            await b.close()
            return why, elapsed

    why, elapsed = asyncio.run(main())
    assert "is gone" in why, why
    assert elapsed < 15.0  # the wait's own bound is 30 s


def test_a_slow_address_book_does_not_delay_the_verdict_on_a_dead_sender():
    """The liveness check dials over the route the daemon already knows before it reads the peer's
    announced addresses from the DHT, which can take seconds on a busy machine: a dead sender's waits
    still fail within the check's bound, not the wait's."""

    async def main() -> tuple[str, float]:
        async with p2p_group(2) as nodes:

            async def slow_book(peer: str) -> list[str]:
                await asyncio.sleep(30.0)
                return []

            a, b = (Mailbox(n, PROTO, TransportConfig(timeout_s=30.0), addresses=slow_book) for n in nodes)
            for box in (a, b):
                await box.start()
            await a.send(b.peer_id, Tag(1), b"hello")
            assert await b.recv(a.peer_id, Tag(1)) == b"hello"
            waiting = asyncio.create_task(b.recv(a.peer_id, Tag(2), 30.0))
            await asyncio.sleep(0.2)
            t0 = time.monotonic()
            await nodes[0].shutdown()
            result = await outcome(waiting, t0)
            await b.close()
            return result

    why, elapsed = asyncio.run(main())
    assert "is gone" in why, why
    assert elapsed < 6.0, elapsed  # the address book alone would take 30 s


def test_a_probe_is_timed_by_both_ends_and_refused_to_strangers():
    """The prober's measurement and the receiver's own timing of it (LinkReport.inbound) agree for an
    honest probe, which is what lets the coordinator cap a lying prober's claim; a peer the server's
    gate does not know gets its stream closed unserved."""
    from potluck.net.config import LinkProbeConfig
    from potluck.net.links import LinkProber

    cfg = LinkProbeConfig(bulk_bytes=8 << 20, frame_bytes=256 << 10, timeout_s=10)

    async def main():
        async with p2p_group(3) as (a, b, stranger):
            members = {a.peer_id.to_base58()}

            async def allow(peer: str) -> bool:
                return peer in members

            server = LinkProber(b, "t", cfg, allow=allow)
            await server.serve()
            sample = await LinkProber(a, "t", cfg).measure(b.peer_id.to_base58())
            with pytest.raises(WireError, match="closed"):
                await LinkProber(stranger, "t", cfg).measure(b.peer_id.to_base58())
            return sample, dict(server.inbound), a.peer_id.to_base58(), stranger.peer_id.to_base58()

    sample, inbound, a_id, stranger_id = asyncio.run(main())
    assert list(inbound) == [a_id] and stranger_id not in inbound
    seen = inbound[a_id].bandwidth_gbps
    # same bytes, same link: the two clocks differ by the first frame and a round trip
    assert 0.1 * sample.bandwidth_gbps < seen < 10 * sample.bandwidth_gbps, (sample, seen)


def test_a_peer_that_never_heard_from_the_dead_one_is_told():
    """Run N: a step's leader had no stream from the victim (it had sent it nothing yet), so nothing
    ended at the leader and it waited out its whole bound while the victim's neighbours knew at once. A
    mailbox that finds a peer gone tells the plan's other peers; each checks for itself."""

    async def main() -> tuple[str, float]:
        async with p2p_group(3) as nodes:
            maddrs = {n.peer_id.to_base58(): [str(m) for m in await n.get_visible_maddrs()] for n in nodes}

            async def book(peer: str) -> list[str]:
                return maddrs.get(peer, [])

            a, b, c = (Mailbox(n, PROTO, TransportConfig(timeout_s=30.0), addresses=book) for n in nodes)
            for box in (a, b, c):
                await box.start()
                await box.admit({a.peer_id, b.peer_id, c.peer_id})
                box.advance(1, 0)
            await a.send(b.peer_id, Tag(1), b"hello")  # a's stream to b is open; a never sent c anything
            assert await b.recv(a.peer_id, Tag(1)) == b"hello"
            b_waits = asyncio.create_task(b.recv(a.peer_id, Tag(2), 30.0))
            c_waits = asyncio.create_task(c.recv(a.peer_id, Tag(2), 30.0))
            await asyncio.sleep(0.2)
            t0 = time.monotonic()
            await nodes[0].shutdown()
            why, elapsed = await outcome(c_waits, t0)
            with contextlib.suppress(WireError):
                await b_waits
            for box in (b, c):
                await box.close()
            return why, elapsed

    why, elapsed = asyncio.run(main())
    assert "is gone" in why, why
    assert elapsed < 15.0  # c's own bound is 30 s


def test_an_injected_dropped_link_carries_nothing_either_way_and_others_still_do():
    """``drop`` (``testbed.faults.drop_links``, read by the worker from ``POTLUCK_FAULTS``): a's link to
    b is down both ways; a and c still talk."""

    async def main():
        async with p2p_group(3) as nodes:
            cfg = TransportConfig(timeout_s=2.0)
            b, c = await mailboxes(nodes[1:], cfg)
            a = Mailbox(nodes[0], PROTO, cfg, drop=frozenset({b.peer_id}))
            await a.start()
            with pytest.raises(WireError, match="the link is down"):
                await a.send(b.peer_id, Tag(1), b"to b")
            assert a.bytes_sent == 0
            # b's side is up: its write goes out, or fails if a closed the stream first (a race)
            await b.send_quietly(a.peer_id, Tag(2), b"to a")
            with pytest.raises(WireError):
                await a.recv(b.peer_id, Tag(2), 1.5)  # and a never reads it
            assert await delivered(a, c, Tag(3), b"a to c") == b"a to c"
            assert await delivered(c, a, Tag(4), b"c to a") == b"c to a"
            for box in (a, b, c):
                await box.close()

    asyncio.run(main())


def test_a_peer_the_coordinator_declared_gone_is_dialled_no_more():
    """Issue 38: the survivors of a dead stage leader dialled it for minutes while the job waited for
    peers. The coordinator's verdict (``TrainPlan.gone``) ends a dial under way and a wait on the peer at
    once, refuses later sends, and lasts until a plan places the peer again."""

    async def main() -> None:
        async with p2p_group(2) as nodes:
            maddrs = {n.peer_id.to_base58(): [str(m) for m in await n.get_visible_maddrs()] for n in nodes}

            async def book(peer: str) -> list[str]:
                return maddrs.get(peer, [])

            a = Mailbox(nodes[0], PROTO, TransportConfig(timeout_s=30.0), addresses=book)
            await a.start()
            dead = nodes[1].peer_id.to_base58()
            await a.admit({a.peer_id, dead})
            a.advance(1, 0)
            await nodes[1].shutdown()  # refuses connections from now on; a retries for its 30 s bound
            t0 = time.monotonic()
            sending = asyncio.create_task(a.send(dead, Tag(1), b"vote"))
            waiting = asyncio.create_task(a.recv(dead, Tag(2), 30.0))
            await asyncio.sleep(1.0)
            assert not sending.done() and not waiting.done()  # still dialling, still waiting
            a.declare_gone([dead])
            sent, waited = await outcome(sending, t0), await outcome(waiting, t0)
            assert "declared it gone" in sent[0] and sent[1] < 5.0, sent
            assert "declared it" in waited[0] and waited[1] < 5.0, waited
            t1 = time.monotonic()
            with pytest.raises(WireError, match="declared it gone"):
                await a.send(dead, Tag(3), b"again")
            with pytest.raises(WireError, match="declared it"):
                await a.recv(dead, Tag(4), 30.0)
            assert time.monotonic() - t1 < 1.0
            await a.admit({a.peer_id, dead})  # a newer plan places it again: it came back
            with pytest.raises(TimeoutError):  # dialled again (the dead daemon refuses for 30 s)
                await asyncio.wait_for(a.send(dead, Tag(5), b"back"), 1.0)
            await a.close()

    asyncio.run(main())
