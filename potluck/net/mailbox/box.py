"""A mailbox over libp2p streams: tagged binary messages between authenticated peers.

Pipeline exchanges and collectives both need "send these bytes to peer X under tag T" and "wait for
the bytes peer Y sends under tag T, for at most S seconds". The sender identity is the libp2p peer id of
the stream, which is the potluck peer id (same key), so a message cannot claim another sender.

Tags (``tags.py``) address messages by round, stream, chunk and direction; finished rounds are
forgotten by span.

Dialing (``dial.py``): the first send to a peer opens one stream, retrying with backoff over every
address the peer announced, all within ``timeout_s``. A receiver closes a stream that stayed silent for
``IDLE_CLOSE`` x ``timeout_s``; a sender never writes into a stream idle for ``REOPEN_AFTER_IDLE`` x
``timeout_s`` but opens a fresh one, since a write into a stream its receiver already closed can be
accepted by the local daemon and lost without an error. A peer whose stream to us ends is checked at
once (does it still accept a connection?); if it is gone, the waits on it fail now, and the plan's other
peers are told (a GONE message) so that those it never sent anything check it too; for
``GONE_MEMORY_S`` after that verdict, waits on it and sends to it fail at once. A peer this mailbox
could not open a stream to, write to, or hear from in time becomes a *suspect* (``take_suspects``): the
worker names it in its "failed" progress record so the coordinator can check whether that peer is still
heartbeating.

Bounds, checked before a message's payload is read: a message is at most the wire layer's TENSOR
limit; messages that arrive before anyone waits for them are buffered up to ``max_pending_bytes`` in
total and ``max_pending_per_sender`` per sender, each costing its length plus ``MESSAGE_COST`` (so empty
messages count); beyond that the handler stops reading (TCP backpressure on the sender) until space
frees or ``timeout_s`` passes, and then drops the stream.

Who may send (``admit``): once the worker names its plan's peers, streams from anyone else are closed
unread and their buffered messages dropped, except a message for a newer plan epoch than this peer's,
which is held unread for up to ``timeout_s`` until this peer reads that plan (its sender read it first).
What may be sent (``advance``): a message for a round more than ``steps_ahead`` steps past this peer's
step, or ``epochs_ahead`` plan epochs past its own, is refused rather than stored (nothing would ever
claim it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from hivemind.p2p import P2P
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo

from potluck.net.config import Pacer, TransportConfig
from potluck.net.dial import AddressBook, open_stream
from potluck.net.mailbox.liveness import Liveness
from potluck.net.pace import Background
from potluck.net.tags import INDEX_BITS, TAG_BYTES, Round, RoundSpan, Stream, Tag
from potluck.protocol.errors import WireError
from potluck.protocol.wire import Frame, MsgType, discard_exactly, read_exactly, read_header, write_frame

logger = logging.getLogger(__name__)
Service = Callable[[str, Tag, bytes], None]  # a handler of one stream's messages (``Mailbox.serve``)

MAX_SUSPECTS = 16  # peers named in one report (Progress.suspects holds at most 16)
IDLE_CLOSE = 10  # x timeout_s: an incoming stream silent this long is closed by its receiver
REOPEN_AFTER_IDLE = 4  # x timeout_s: a sender opens a fresh stream rather than reuse one idle this long
MAX_GONE_BYTES = 128  # a GONE message names one peer id
LATE_ADMIT_POLL_S = 0.25  # how often a held message from a newer plan's peer asks again
MESSAGE_COST = 1024  # bytes a buffered message is charged beyond its payload (key, tag, bookkeeping)
MAX_GIVEN_UP = 4096  # steps given up remembered (one per peer of the plan at most, and the leader's)


class Mailbox(Liveness):
    def __init__(
        self,
        p2p: P2P,
        protocol: str,
        cfg: TransportConfig,
        pacer: Pacer | None = None,
        addresses: AddressBook | None = None,
        vouch: Callable[[str], Awaitable[bool]] | None = None,
        drop: frozenset[str] = frozenset(),
    ) -> None:
        """``drop``: peers whose link is down, injected by a test (``net/faults.py``): nothing is sent
        to them and nothing they send is read."""
        self.p2p, self.protocol, self.cfg = p2p, protocol, cfg
        self.drop = drop
        self.pacer = pacer  # paces sends to configured link rates (benchmarks, upload caps)
        self.background = Background()  # rounds sent in the foreground's gaps (an overlapped outer sync)
        self.addresses = addresses  # where a peer said it listens (its heartbeat); None: the daemon's route
        self.vouch = vouch  # asked about a sender outside the admitted peers: is it in a newer plan?
        self.peer_id = p2p.peer_id.to_base58()
        # buffered messages and when each arrived (perf_counter s: the pipeline's message-cost figures)
        self._pending: dict[tuple[str, Tag], tuple[bytes, float]] = {}
        self._waiters: dict[tuple[str, Tag], asyncio.Future[bytes]] = {}
        self._pending_bytes = 0
        self._held: dict[str, int] = {}  # sender -> bytes charged for its buffered messages
        self._space = asyncio.Condition()
        self._admitted: frozenset[str] | None = None  # None: anyone (before the first plan; tests)
        self._horizon: Round | None = None  # the newest round a message may be for; None: any
        self._epoch: int | None = None  # the plan epoch this peer runs (advance); None: none yet
        self.refused = 0  # messages and streams refused (unadmitted sender, too far ahead, over quota)
        self._out: dict[str, tuple[asyncio.StreamWriter, asyncio.Lock]] = {}
        self._used: dict[str, float] = {}  # peer -> when its outgoing stream last carried a message
        self._opening: dict[str, asyncio.Lock] = {}
        self.bytes_sent = 0
        self.bytes_received = 0
        self.sent_to: dict[str, int] = {}  # peer -> payload bytes sent to it (telemetry: bytes per link)
        self._suspects: dict[str, float] = {}  # peer -> when it last failed us (monotonic s)
        self._checks: dict[str, asyncio.Task[None]] = {}  # peer -> its liveness check under way
        # Its own background tasks: a watch per outgoing stream (has its receiver closed it?), GONE sends
        self._background: set[asyncio.Task[Any]] = set()
        self._told: set[str] = set()  # peers this mailbox told its plan's peers are gone
        self._step = 0  # the step this peer runs (advance)
        # Peers whose stream to us ended and that have not opened another since: a wait on one of them
        # that starts later checks it at once (a wait begun after the stream ended would otherwise run
        # out its whole bound on a peer that died before anyone waited on it).
        self._ended: set[str] = set()
        self._gone: dict[str, float] = {}  # peer -> when a check found it refusing connections (monotonic)
        # Peers the coordinator declared gone (``declare_gone``) and their dials under way: no message
        # goes to them and no wait on them lasts, until a plan admits them again.
        self._declared: set[str] = set()
        self._dialing: dict[str, set[asyncio.Task[Any]]] = {}
        # stream kind -> (most payload bytes, handler) for messages handled on arrival (``serve``)
        self._services: dict[int, tuple[int, Service]] = {Stream.GONE: (MAX_GONE_BYTES, self._on_gone)}
        # steps given up (``abort_step``): by the leader for everyone (key None), or by one peer for its
        # own messages (key: that peer) -> (epoch, step), why, the stream kinds still awaited
        self._aborted: dict[str | None, tuple[tuple[int, int], str, frozenset[int]]] = {}

    async def start(self) -> None:
        await self.p2p.add_binary_stream_handler(self.protocol, self._handle)

    def serve(self, stream: Stream, max_bytes: int, handler: Service) -> None:
        """Hand each message of ``stream`` (at most ``max_bytes``, else its stream is closed) to ``handler``
        as it arrives, unbuffered: questions asked at any time (``peer/train/termination.py``)."""
        self._services[int(stream)] = (max_bytes, handler)

    async def close(self) -> None:
        for task in [*self._checks.values(), *self._background]:
            task.cancel()
        for writer, _ in self._out.values():
            writer.close()
        self._out.clear()
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(WireError("mailbox closed"))
        with contextlib.suppress(Exception):
            await self.p2p.remove_binary_stream_handler(self.protocol)

    # ---- sending -----------------------------------------------------------------------------------

    async def send(self, peer: str, tag: Tag, payload: bytes) -> None:
        """Deliver ``payload`` to ``peer`` under ``tag``; raises ``WireError`` on failure or timeout."""
        if peer in self.drop:
            raise WireError(f"send to {peer} failed: the link is down (an injected fault)")
        if peer in self._declared:
            raise WireError(f"send to {peer} failed: the coordinator declared it gone")
        if (ago := self._gone_for(peer)) is not None:
            raise WireError(f"send to {peer} failed: it is gone (it refused a connection {ago:.1f} s ago)")
        if peer == self.peer_id:  # loopback to ourselves: no stream needed
            await self._reserve(peer, len(payload))
            await self._deliver(peer, tag, payload)
            return
        writer, lock = await self._stream_to(peer)
        if self.pacer is not None:
            await self.pacer.pace(self.peer_id, peer, len(payload))
        await self.background.wait(tag.round, len(payload))
        async with lock:
            try:
                await write_frame(writer, Frame(MsgType.TENSOR, tag.pack() + payload), self.cfg.timeout_s)
            except (WireError, ConnectionError, OSError) as e:
                self._out.pop(peer, None)
                writer.close()
                self.suspect(peer)
                raise WireError(f"send to {peer} failed: {e}") from None
            self._used[peer] = time.monotonic()
        self.bytes_sent += len(payload)
        self.sent_to[peer] = self.sent_to.get(peer, 0) + len(payload)

    async def _stream_to(self, peer: str) -> tuple[asyncio.StreamWriter, asyncio.Lock]:
        # One outgoing stream per peer: concurrent first sends must not race to open several.
        async with self._opening.setdefault(peer, asyncio.Lock()):
            cached = self._out.get(peer)
            idle = time.monotonic() - self._used.get(peer, 0.0)
            if cached is not None and not cached[0].is_closing():
                if idle < REOPEN_AFTER_IDLE * self.cfg.timeout_s:
                    return cached
                # The receiver drops a stream silent for IDLE_CLOSE x timeout; a write into it could be
                # accepted locally and never read (seen: a pipeline deadlocked on a lost activation).
                cached[0].close()
            return await self._open(peer)

    async def _open(self, peer: str) -> tuple[asyncio.StreamWriter, asyncio.Lock]:
        # A task of its own, so that the coordinator's verdict (``declare_gone``) can end the dial now.
        dial = asyncio.create_task(
            open_stream(self.p2p, peer, self.protocol, self.cfg.timeout_s, self.addresses)
        )
        dials = self._dialing.setdefault(peer, set())
        dials.add(dial)
        try:
            reader, writer = await dial
        except WireError:
            self.suspect(peer)
            raise
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if dial.cancelled() and peer in self._declared and (me is None or not me.cancelling()):
                raise WireError(f"send to {peer} failed: the coordinator declared it gone") from None
            dial.cancel()  # our caller was cancelled: the dial goes with it
            raise
        finally:
            dials.discard(dial)
            if not dials:
                self._dialing.pop(peer, None)
        entry = (writer, asyncio.Lock())
        self._out[peer] = entry
        self._used[peer] = time.monotonic()
        watch = asyncio.create_task(self._watch(peer, entry, reader), name=f"out-{peer[-8:]}")
        self._background.add(watch)
        watch.add_done_callback(self._background.discard)
        return entry

    async def _watch(
        self, peer: str, entry: tuple[asyncio.StreamWriter, asyncio.Lock], reader: asyncio.StreamReader
    ) -> None:
        """Drop the outgoing stream to ``peer`` once its receiver closed it. A receiver never writes on
        it, so the read returns only at its end: the receiver refused the sender (not a peer of its plan
        at that moment), dropped it as idle, or died. A later message then opens a fresh stream instead
        of going into one nobody reads, which the local daemon would accept and lose without an error
        (seen: a plan's start barrier hung when a former spare's READY went into a stream its leader
        had closed while it was a spare)."""
        with contextlib.suppress(ConnectionError, OSError):
            await reader.read(1)
        if self._out.get(peer) is entry:
            del self._out[peer]
            entry[0].close()
            logger.debug("outgoing stream to %s closed by its receiver; the next message opens another", peer)

    # ---- suspects ----------------------------------------------------------------------------------

    def suspect(self, peer: str) -> None:
        """Note that ``peer`` failed us (a dial, a write, or a message that did not come in time)."""
        if peer != self.peer_id:
            self._suspects[peer] = time.monotonic()

    def take_suspects(self) -> list[str]:
        """The peers that failed us since the last call, most recent first (at most ``MAX_SUSPECTS``);
        forgets them. A suspicion is a hint, not a verdict: the coordinator confirms it by heartbeat."""
        out = sorted(self._suspects, key=self._suspects.__getitem__, reverse=True)[:MAX_SUSPECTS]
        self._suspects.clear()
        return out

    def abort_step(
        self, epoch: int, step: int, why: str, keep: frozenset[int], sender: str | None = None
    ) -> int:
        """Step ``step`` of plan epoch ``epoch`` will not commit: fail every wait on its messages now, and
        each one begun later, except those of the stream kinds in ``keep`` (the commit's own, which still
        bring the verdict). ``sender`` None: its leader said so, for every sender's messages; a peer: that
        peer's own step failed, and only waits on what it would have sent fail (it sends nothing more,
        as a dead peer would not). A peer waiting on a live peer that gave the step up (a pipeline
        neighbour that lost its own partner) would otherwise wait out its bound: churn run E reported a
        kill 2 s late this way, and run L's leader waited for a neighbour's gradients that never came
        while the neighbour's failure waited for the leader's commit. Returns how many waits failed now."""
        if len(self._aborted) >= MAX_GIVEN_UP:
            self._aborted.clear()
        self._aborted[sender] = ((epoch, step), why, keep)
        return self._fail_waits(lambda peer, tag: self._given_up(peer, tag) is not None, WireError(why))

    def _given_up(self, peer: str, tag: Tag) -> str | None:
        """Why a wait on ``peer``'s message ``tag`` fails at once (``abort_step``); None: it does not."""
        r = Round.unpack(tag.round)
        for who in (None, peer):
            entry = self._aborted.get(who)
            if (
                entry is not None
                and entry[0] == (r.epoch, r.step)
                and tag.stream >> INDEX_BITS not in entry[2]
            ):
                return entry[1]
        return None

    # ---- who may send what ---------------------------------------------------------------------------

    def declare_gone(self, peers: list[str] | frozenset[str]) -> None:
        """The coordinator declared ``peers`` gone (``TrainPlan.gone``): sends to them and waits on them
        fail now, dials under way included, instead of retrying until the step's bound (issue 38: the
        survivors of a dead leader dialled it for minutes while the job waited for peers). Lasts until
        ``admit`` names one of them again (a newer plan placed it: it came back)."""
        new = set(peers) - self._declared - {self.peer_id}
        if not new:
            return
        self._declared |= new
        failed = 0
        for peer in new:
            for dial in self._dialing.get(peer, ()):
                dial.cancel()
            verdict = WireError(f"{peer} is gone: the coordinator declared it")
            failed += self._fail_waits_on(peer, verdict)
            if (out := self._out.pop(peer, None)) is not None:
                out[0].close()
        logger.info("declared gone by the coordinator: %s (%d wait(s) failed now)", sorted(new), failed)

    async def admit(self, peers: frozenset[str] | set[str] | None) -> None:
        """Accept messages only from ``peers`` (and ourselves); ``None``: from anyone. Buffered messages
        of senders no longer admitted are dropped."""
        self._admitted = None if peers is None else frozenset(peers) | {self.peer_id}
        self._declared -= self._admitted or set()  # placed again: back, whatever was declared before
        if self._admitted is None:
            return
        self._ended &= self._admitted
        self._told &= self._admitted
        async with self._space:
            for key in [k for k in self._pending if k[0] not in self._admitted]:
                self._release(key)
            self._space.notify_all()

    def advance(self, epoch: int, step: int, steps_ahead: int | None = None) -> None:
        """This peer now runs step ``step`` of plan epoch ``epoch``: messages for rounds beyond
        ``steps_ahead`` (default: the config's) steps later, in this or the next ``epochs_ahead``
        epochs, are refused. A replica the deadline policy leaves out may lag its stage by up to
        ``max_misses`` steps, so its trainer widens the window to that."""
        ahead = min(step + max(steps_ahead or 0, self.cfg.steps_ahead), (1 << 30) - 1)
        self._horizon = Round(min(epoch + self.cfg.epochs_ahead, (1 << 27) - 1), ahead)
        self._epoch, self._step = epoch, step

    async def _admissible(self, sender: str) -> bool:
        if self._admitted is None or sender in self._admitted:
            return True
        if self.vouch is None:
            return False
        try:  # a newer plan may name it before this peer has read that plan
            vouched = await asyncio.wait_for(self.vouch(sender), self.cfg.timeout_s)
        except TimeoutError:
            return False
        if vouched and self._admitted is not None:
            self._admitted |= {sender}  # until the next admit(), which the newer plan brings
        return vouched

    async def _admit_late(self, sender: str, tag: Tag) -> bool:
        """A message of a plan epoch newer than this peer's from a sender outside its plan: the sender
        read the newer plan first (a start-barrier READY often comes before this peer's next poll).
        Hold the message (its stream unread, TCP pushing back) until this peer admits the sender or
        vouches for it, for at most ``timeout_s``; dropping it would stall the new plan (seen in the
        churn benchmark: a lost READY held a plan at its start barrier for 37 s)."""
        if self._epoch is None or Round.unpack(tag.round).epoch <= self._epoch:
            return False
        deadline = time.monotonic() + self.cfg.timeout_s
        while time.monotonic() < deadline:
            await asyncio.sleep(LATE_ADMIT_POLL_S)
            if await self._admissible(sender):
                return True
        return False

    def _in_horizon(self, tag: Tag) -> bool:
        if self._horizon is None:
            return True
        r = Round.unpack(tag.round)
        if r.epoch > self._horizon.epoch:
            return False
        # A newer plan may start at any step: its messages are bounded by epochs_ahead and the sender's
        # share, not by this peer's step (seen: a spare still at the step it last trained refused the
        # start-barrier READY of the plan that placed it, and the plan stalled at its barrier).
        return (self._epoch is not None and r.epoch > self._epoch) or r.step <= self._horizon.step

    # ---- receiving ---------------------------------------------------------------------------------

    async def recv(self, peer: str, tag: Tag, timeout_s: float | None = None) -> bytes:
        """The payload ``peer`` sent under ``tag``; raises ``WireError`` if it does not come in time."""
        return (await self.recv_stamped(peer, tag, timeout_s))[0]

    async def recv_stamped(self, peer: str, tag: Tag, timeout_s: float | None = None) -> tuple[bytes, float]:
        """``recv``, with when the message arrived (``time.perf_counter`` s)."""
        key = (peer, tag)
        if key in self._pending:
            return await self._claim(key)
        fut = self._waiters.get(key)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._waiters[key] = fut
        if peer in self._declared:
            self._waiters.pop(key, None)
            raise WireError(f"{peer} is gone: the coordinator declared it")
        if (why := self._given_up(peer, tag)) is not None:
            self._waiters.pop(key, None)
            raise WireError(why)
        if (ago := self._gone_for(peer)) is not None:
            self._waiters.pop(key, None)
            self.suspect(peer)
            raise WireError(f"{peer} is gone: its stream ended and it refused a connection {ago:.1f} s ago")
        if peer in self._ended:
            self._check_alive(peer)
        timeout = self.cfg.timeout_s if timeout_s is None else timeout_s
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            self.suspect(peer)
            raise WireError(f"no message {tag} from {peer} within {timeout:.1f} s") from None
        finally:
            self._waiters.pop(key, None)
        return await self._claim(key)

    async def _claim(self, key: tuple[str, Tag]) -> tuple[bytes, float]:
        async with self._space:
            got = self._release(key)
            self._space.notify_all()
        return got

    def _release(self, key: tuple[str, Tag]) -> tuple[bytes, float]:
        payload, arrived = self._pending.pop(key)
        cost = len(payload) + MESSAGE_COST
        self._pending_bytes -= cost
        self._held[key[0]] -= cost
        if not self._held[key[0]]:
            del self._held[key[0]]
        return payload, arrived

    async def forget(self, span: RoundSpan) -> int:
        """Drop buffered messages whose round lies in ``span`` (late arrivals of finished rounds); returns
        how many. A span, not "every round up to r": rounds after it (a later step's early messages, a
        collective still running in another phase) keep theirs."""
        async with self._space:
            stale = [k for k in self._pending if k[1].round in span]
            for k in stale:
                self._release(k)
            self._space.notify_all()
        return len(stale)

    async def _reserve(self, sender: str, length: int) -> None:
        """Wait until ``sender`` may buffer a message of ``length`` payload bytes (TCP backpressure while
        we wait: we have not read it); ``WireError`` after ``timeout_s``. Reserves the space."""
        cost = length + MESSAGE_COST
        own = min(self.cfg.max_pending_per_sender, self.cfg.max_pending_bytes)
        if cost > own:
            self.refused += 1
            raise WireError(f"a {length}-byte message from {sender} exceeds its {own}-byte share")
        async with self._space:
            deadline = time.monotonic() + self.cfg.timeout_s
            while (
                self._pending_bytes + cost > self.cfg.max_pending_bytes
                or self._held.get(sender, 0) + cost > own
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.refused += 1
                    raise WireError(
                        f"mailbox full ({self._pending_bytes} bytes pending, {self._held.get(sender, 0)} "
                        f"from {sender}); dropping its stream"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._space.wait(), remaining)
            self._pending_bytes += cost
            self._held[sender] = self._held.get(sender, 0) + cost

    async def _unreserve(self, sender: str, length: int) -> None:
        async with self._space:
            cost = length + MESSAGE_COST
            self._pending_bytes -= cost
            self._held[sender] -= cost
            if not self._held[sender]:
                del self._held[sender]
            self._space.notify_all()

    async def _deliver(self, sender: str, tag: Tag, payload: bytes) -> None:
        """Buffer a message (its space reserved by ``_reserve``) and wake whoever waits for it."""
        key = (sender, tag)
        if key in self._pending:
            # harmless (the first copy is kept); start barriers re-send READY until the leader answers
            logger.info("duplicate message %s from %s ignored", tag, sender)
            await self._unreserve(sender, len(payload))
            return
        self._pending[key] = (payload, time.perf_counter())
        fut = self._waiters.get(key)
        if fut is not None and not fut.done():
            fut.set_result(b"")

    async def _handle(
        self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        sender = info.peer_id.to_base58()
        if sender in self.drop:  # an injected fault: the link is down both ways
            writer.close()
            return
        self._ended.discard(sender)  # it opened a stream: alive, whatever an older stream's end said
        self._gone.pop(sender, None)
        known = self._admitted is None or sender in self._admitted  # strangers: see the first message
        try:
            while True:
                try:
                    # Idle streams are normal between rounds: wait long, but never forever. A sender
                    # outside the plan gets one short wait for the message that may show it is in a
                    # plan this peer has not read yet.
                    idle = IDLE_CLOSE * self.cfg.timeout_s if known else self.cfg.timeout_s
                    _, _, length = await read_header(reader, idle, expect={MsgType.TENSOR})
                except WireError as e:
                    if "closed" not in str(e):
                        logger.info("stream from %s ended: %s", sender, e)
                    else:  # the sender closed it: a fresh stream (after a silence), or it died
                        self._check_alive(sender)
                    return
                if length < TAG_BYTES:
                    logger.warning("message without a tag from %s; closing its stream", sender)
                    return
                tag = Tag.unpack(await read_exactly(reader, TAG_BYTES, self.cfg.timeout_s))
                known = await self._admissible(sender) or await self._admit_late(sender, tag)
                if not known:  # closed unread: its payload is never read, let alone stored
                    self.refused += 1
                    logger.info("refused %s from %s: not a peer of this peer's plan", tag, sender)
                    return
                if not self._in_horizon(tag):  # read past it, unstored: the stream's later messages count
                    self.refused += 1
                    logger.warning("refused message %s from %s: too far ahead of this peer", tag, sender)
                    await discard_exactly(reader, length - TAG_BYTES, self.cfg.timeout_s)
                    continue
                service = self._services.get(tag.stream >> INDEX_BITS)
                if service is not None:  # for a handler, never stored
                    if length - TAG_BYTES > service[0]:
                        logger.warning(
                            "a %d-byte %s from %s; closing its stream", length - TAG_BYTES, tag, sender
                        )
                        return
                    service[1](
                        sender, tag, await read_exactly(reader, length - TAG_BYTES, self.cfg.timeout_s)
                    )
                    continue
                await self._reserve(sender, length - TAG_BYTES)  # before reading (allocating) the payload
                try:
                    payload = await read_exactly(reader, length - TAG_BYTES, self.cfg.timeout_s)
                except BaseException:
                    await self._unreserve(sender, length - TAG_BYTES)
                    raise
                self.bytes_received += len(payload)
                await self._deliver(sender, tag, payload)
        except WireError as e:
            logger.warning("%s", e)
        finally:
            writer.close()

    async def send_quietly(self, peer: str, tag: Tag, payload: bytes) -> str | None:
        """``send``, for a peer that may be gone: the failure's reason instead of an error (None: sent)."""
        try:
            await self.send(peer, tag, payload)
        except WireError as e:
            return str(e) or type(e).__name__
        return None
