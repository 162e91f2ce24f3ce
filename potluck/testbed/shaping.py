"""An in-process link shaper: paces sends to configured rates, for benchmarks and upload caps.

Each resource (a directed link, a peer's uplink, a peer's downlink) has a rate in bytes/s and a clock of
when it is next free. A message of n bytes from u to v starts when its link and u's uplink and v's
downlink are all free, occupies each for n / rate, and is released when the slowest of them finishes:
the same fluid model the tree packer plans with. Several mailboxes in one process share one shaper, so
receiver downlinks are shaped too.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field


@dataclass
class LinkShaper:
    link_rate: dict[tuple[str, str], float] = field(default_factory=dict)  # bytes/s per (src, dst)
    up_rate: dict[str, float] = field(default_factory=dict)  # bytes/s per peer uplink
    down_rate: dict[str, float] = field(default_factory=dict)  # bytes/s per peer downlink
    _free_at: dict[object, float] = field(default_factory=dict)

    async def pace(self, src: str, dst: str, nbytes: int) -> None:
        """Sleep until ``nbytes`` from ``src`` to ``dst`` would have crossed the shaped resources."""
        resources = [
            (("link", src, dst), self.link_rate.get((src, dst))),
            (("up", src), self.up_rate.get(src)),
            (("down", dst), self.down_rate.get(dst)),
        ]
        shaped = [(key, rate) for key, rate in resources if rate]
        if not shaped:
            return
        now = time.monotonic()
        start = max([now] + [self._free_at.get(key, 0.0) for key, _ in shaped])
        finish = start
        for key, rate in shaped:
            busy_until = start + nbytes / rate
            self._free_at[key] = busy_until
            finish = max(finish, busy_until)
        await asyncio.sleep(finish - now)
