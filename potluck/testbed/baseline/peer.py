"""One hivemind baseline peer's runtime: its p2p daemon in a loop thread, children that die with it, the
start barrier on the DHT, what hivemind's log says happened each epoch, hivemind's compression by name,
and a bounded shutdown. The training side is ``training.py``; what is matched against potluck and why,
this package's docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from hivemind.compression import (
    Float16Compression,
    NoCompression,
    SizeAdaptiveCompression,
    Uniform8BitQuantization,
)
from hivemind.p2p import P2P
from hivemind.utils import get_dht_time

from potluck import lifeline
from potluck.net.node import p2pd_dies_with_this_process
from potluck.testbed.baseline.settings import COMPRESSIONS

logger = logging.getLogger(__name__)

BARRIER_POLL_S = 0.5  # how often a peer looks for the others before training
DHT_CALL_TIMEOUT_S = 15.0  # one DHT store or get of the start barrier


def children_die_with_this_process() -> None:
    """Every process forked from here on (hivemind's DHT and averager processes are ``fork`` children)
    gets PR_SET_PDEATHSIG = SIGKILL, so a SIGKILLed worker leaves none of them behind."""
    pending: dict[str, Callable[[], None] | None] = {}

    def before() -> None:
        pending["fn"] = lifeline.preexec(signal.SIGKILL)  # records this process as the parent

    def in_child() -> None:
        fn = pending.pop("fn", None)
        if fn is not None:
            fn()

    def in_parent() -> None:
        pending.pop("fn", None)

    os.register_at_fork(before=before, after_in_child=in_child, after_in_parent=in_parent)


class LoopThread:
    """An asyncio loop in a thread that lives as long as the worker: it spawns p2pd, whose
    PR_SET_PDEATHSIG fires when the spawning thread ends."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="p2p-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5.0)


async def start_p2p(host: str, initial_peers: list[str], timeout_s: float) -> Any:
    """A p2p daemon listening on ``host`` (TCP, any port), retrying until a bootstrap peer answers."""
    maddr = host if host.startswith("/") else f"/ip4/{host}/tcp/0"
    deadline = time.monotonic() + timeout_s
    delay = 0.5
    while True:
        try:
            with p2pd_dies_with_this_process():
                return await P2P.create(
                    initial_peers=initial_peers or None,
                    host_maddrs=[maddr],
                    nat_port_map=False,  # no UPnP probing of a home router that is not there
                    startup_timeout=max(5.0, deadline - time.monotonic()),
                )
        except Exception as e:
            if not initial_peers or time.monotonic() + delay > deadline:
                raise
            logger.info("bootstrap peers not reachable yet (%s); retrying in %.1f s", e, delay)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 4.0)


def wait_for_swarm(dht: Any, key: str, index: int, n: int, timeout_s: float) -> int:
    """Announce this peer under ``key`` and wait until all ``n`` peers have: every peer starts from the
    same initial weights at epoch 0, none trains alone first. Returns the peers seen."""
    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline:
        left = max(1.0, deadline - time.monotonic())
        stored = dht.store(
            key, subkey=index, value=True, expiration_time=get_dht_time() + 3600, return_future=True
        )
        with contextlib.suppress(TimeoutError):
            stored.result(timeout=min(left, DHT_CALL_TIMEOUT_S))
        try:
            found = dht.get(key, latest=True, return_future=True).result(
                timeout=min(left, DHT_CALL_TIMEOUT_S)
            )
        except TimeoutError:
            found = None
        seen = len(found.value) if found is not None and isinstance(found.value, dict) else 0
        if seen >= n:
            return seen
        time.sleep(BARRIER_POLL_S)
    raise TimeoutError(f"only {seen} of {n} peers announced themselves within {timeout_s:.0f} s")


def wait_for_tracker(opt: Any, n: int, timeout_s: float) -> None:
    """Wait until hivemind's progress tracker counts all ``n`` peers (a peer is counted once it has
    reported samples, i.e. after its first ``opt.step``). Without this the first peer to finish its
    first target batch believes it is alone, steps without averaging and leaves the others to download
    its state. The throughput estimate is paused meanwhile, so the wait does not count as slowness."""
    deadline = time.monotonic() + timeout_s
    with opt.tracker.performance_ema.pause():
        while opt.tracker.global_progress.num_peers < n:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"hivemind's tracker saw {opt.tracker.global_progress.num_peers} of {n} peers "
                    f"within {timeout_s:.0f} s"
                )
            time.sleep(0.05)


class HivemindEvents(logging.Handler):
    """Reads hivemind.Optimizer's status messages (logged at INFO when ``verbose=True``): the size of each
    gradient and parameter averaging group, rounds that fell back to local gradients, and resyncs (a
    peer that fell behind downloads the whole state from another). hivemind's docs tune
    ``matchmaking_time`` by exactly these: "increase if you see 'averaged gradients with N peers' where
    N is below 0.9x the real size on >= 25% of epochs"."""

    PATTERNS = (
        ("grad_group", re.compile(r"^Averaged gradients with (\d+) peers")),
        ("state_group", re.compile(r"^Averaged parameters with (\d+) peers")),
        ("local_fallback", re.compile(r"^Proceeding with local gradients")),
        ("resync", re.compile(r"^Peer is out of sync")),  # it then downloads the full state
    )

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.lock_ = threading.Lock()
        self.epoch: dict[str, Any] = {}
        self.totals = {"local_fallback": 0, "resync": 0}

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            msg = record.getMessage()
            for key, pattern in self.PATTERNS:
                m = pattern.match(msg)
                if m is None:
                    continue
                with self.lock_:
                    if m.groups():
                        self.epoch[key] = int(m.group(1))
                    else:
                        self.epoch[key] = self.epoch.get(key, 0) + 1
                        self.totals[key] += 1

    def take(self) -> dict[str, Any]:
        """What happened since the last call, plus the running totals."""
        with self.lock_:
            out = {"grad_group": None, "state_group": None, "local_fallback": 0, "resync": 0}
            out.update(self.epoch)
            self.epoch = {}
            out.update({f"{k}_total": v for k, v in self.totals.items()})
        return out


def make_compression(name: str, q8_threshold: int) -> Any:
    """hivemind's compression for gradients and parameters: ``none``, ``fp16`` or ``8bit``."""
    if name == "none":
        return NoCompression()
    if name == "fp16":
        return Float16Compression()
    if name == "8bit":
        return SizeAdaptiveCompression(
            threshold=q8_threshold, less=Float16Compression(), greater_equal=Uniform8BitQuantization()
        )
    raise ValueError(f"compression {name!r} is not one of {COMPRESSIONS}")


def shutdown(opt: Any, dht: Any, p2p: Any, loop: LoopThread, timeout_s: float) -> None:
    """hivemind's own shutdowns, each bounded: a thread does them and the worker waits ``timeout_s``
    at most (the children die with the worker anyway)."""

    def work() -> None:
        for name, fn in (
            ("optimizer", None if opt is None else opt.shutdown),
            ("dht", None if dht is None else dht.shutdown),
        ):
            if fn is None:
                continue
            try:
                fn()
            except Exception:
                logger.exception("%s shutdown failed", name)
        if p2p is not None:
            with contextlib.suppress(Exception):
                loop.run(p2p.shutdown(), 10.0)

    t = threading.Thread(target=work, name="shutdown", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        logger.warning("hivemind did not shut down within %.0f s; exiting anyway", timeout_s)
    loop.stop()
