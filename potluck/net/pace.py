"""Sending at a share of this peer's uplink: a virtual clock that spaces bytes out, and a frame writer
that sends a payload in slices, each when the clock allows.

Two kinds of traffic leave a training peer's uplink beside the pipeline's: state it serves
(``transfer/pace.py``) and a DiLoCo outer sync running under the next steps (``net/mailbox/``,
``Mailbox.background``). Unpaced, either fills a home uplink's queue for seconds, and the activations,
gradients and commit messages the swarm waits on queue behind it. Paced at a share of the uplink the
queue stays short, and training traffic keeps the rest.

The pacer is a virtual clock shared by its users: each slice of bytes reserves the next
``nbytes / rate`` seconds of the share and waits for its turn. Idle time earns no credit: traffic that
starts after a quiet minute still starts at the rate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from potluck.net.tags import RoundSpan
from potluck.protocol.wire import Frame, drain, encode_header

SLICE_BYTES = 16 << 10  # bytes written between two looks at the pacer


class Throttle:
    def __init__(self, rate: Callable[[], float | None], clock: Callable[[], float] = time.monotonic) -> None:
        """``rate()``: the bytes/s serving may take now; None or <= 0: no cap."""
        self.rate, self.clock = rate, clock
        self._free_at = 0.0  # when the share is next free, on ``clock``

    def reserve(self, nbytes: int) -> float:
        """Reserve the share for ``nbytes``; the seconds to wait before sending them (0: at once)."""
        rate, now = self.rate(), self.clock()
        if rate is None or rate <= 0:
            self._free_at = now
            return 0.0
        start = max(now, self._free_at)
        self._free_at = start + nbytes / rate
        return start - now

    async def wait(self, nbytes: int) -> None:
        if (delay := self.reserve(nbytes)) > 0:
            await asyncio.sleep(delay)


async def write_paced(writer: asyncio.StreamWriter, frame: Frame, timeout_s: float, pacer: Throttle) -> None:
    """``protocol.wire.write_frame``, its payload sent in slices of at most ``SLICE_BYTES``, each when
    ``pacer`` allows. ``timeout_s`` bounds each slice's drain (the pacer's waits are not the peer's)."""
    writer.write(encode_header(frame.type, len(frame.payload), frame.flags))
    view = memoryview(frame.payload)
    for start in range(0, max(len(view), 1), SLICE_BYTES):
        piece = view[start : start + SLICE_BYTES]
        await pacer.wait(len(piece))
        writer.write(piece)
        await drain(writer, frame.type, timeout_s)


class Background:
    """The rounds a mailbox sends as background traffic (``mark``): a DiLoCo outer sync running under
    the next steps, whose bytes would otherwise fill a home uplink's queue ahead of the activations and
    commit messages the swarm waits on.

    Strict priority, kept at the sender: every foreground message adds its bytes to a virtual queue that
    drains at the uplink's rate (``uplink()``, bytes/s; None: unknown, nothing is paced), and a
    background message waits until that queue is empty, then for its turn at ``share`` of the uplink.
    So the sync fills the gaps the pipeline leaves (stage 1's uplink before the first gradient, stage
    0's after the last activation) rather than taking half the link while the pipeline needs it.
    Each background message goes whole once its turn comes, so senders keep them small
    (``peer/train/local.py``, ``BACKGROUND_CHUNK_ELEMENTS``). Unmarked once someone waits for the
    round: its rest then goes at full speed."""

    def __init__(self, share: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.uplink: Callable[[], float | None] | None = None  # set by the peer
        self.share, self.clock = share, clock
        self.span: RoundSpan | None = None
        self.throttle = Throttle(self._rate, clock)
        self._foreground_until = 0.0  # when the foreground's virtual queue drains, on ``clock``

    def mark(self, span: RoundSpan | None) -> None:
        self.span = span

    def _up(self) -> float | None:
        up = self.uplink() if self.uplink is not None else None
        return up if up is not None and up > 0 else None

    def _rate(self) -> float | None:
        up = self._up()
        return None if self.span is None or up is None else up * self.share

    async def wait(self, round_: int, nbytes: int) -> None:
        """Wait until a message of ``nbytes`` in round ``round_`` (packed) may go: at once for the
        foreground (counted), after the foreground's queue and at the share for the background."""
        up = self._up()
        if up is None:
            return
        if self.span is None or round_ not in self.span:
            self._foreground_until = max(self.clock(), self._foreground_until) + nbytes / up
            return
        while (gap := self._foreground_until - self.clock()) > 0 and self.span is not None:
            await asyncio.sleep(gap)
        await self.throttle.wait(nbytes)
