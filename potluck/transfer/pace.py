"""State serving at a lower priority than training: a share of this peer's uplink, not a pause.

A peer that trains also serves its state: to a newcomer taking a place in the next plan, to the peer
keeping a copy of its checkpoints, to the job owner's copy. Unpaced, one fetch fills a home uplink
(5-20 Mbit/s) for seconds, and the activations and gradient shards the pipeline waits on queue behind it
in the link's buffer: every step of the swarm slows while one peer is fed. So while this peer trains,
what it serves goes out at most at ``TransferConfig.serve_share`` of its uplink (half by default), summed
over every stream it serves; training traffic keeps the rest. When it does not train (between plans,
waiting for the state of a new one) serving runs at the link's full speed: then the fetch is what
everyone waits on.

The pacer is a virtual clock shared by the server's streams: each slice of bytes reserves the next
``nbytes / rate`` seconds of the share and waits for its turn. Slices are small (16 KiB) so a 1 MiB chunk
does not leave as one burst that the uplink's queue would hold in front of a training message. Idle time
earns no credit: a fetch that starts after a quiet minute still starts at the rate. The server sets the
rate (``StateServer._rate``), with a floor that keeps each chunk inside the fetcher's frame timeout.
A fetch with a cap of its own (``TransferConfig.rate_bytes_s``, background copies) waits on the same
throttle after each chunk it receives (``pull.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from potluck.protocol.wire import Frame, drain, encode_header

SLICE_BYTES = 16 << 10  # bytes written between two looks at the pacer
SERVE_SHARE = 0.5  # the default share of the uplink serving takes while the peer trains


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
