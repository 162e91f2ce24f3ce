"""A coordinator coming back to its swarm: join through the peers it remembers, read what it left behind.

The I/O half of a restart; ``job.recover`` decides what to carry on with. Joining: ``--initial-peers``
and the remembered peers' addresses together; with only remembered peers, none answering within
``rejoin_timeout_s`` means the swarm is gone, so the coordinator starts a new DHT (a warning says so)
instead of refusing to start. Reading: the plan and progress keys, retried while the DHT does not
answer (bounded by ``recover_timeout_s``), because planning epoch 1 blindly over a swarm that follows a
higher epoch would stall it (see ``job.recover``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Collection

from potluck.aio import bounded
from potluck.coordinator.config import CoordinatorConfig
from potluck.coordinator.errors import CoordinatorError
from potluck.coordinator.job.recover import Recovery, recover
from potluck.coordinator.memory import (
    SwarmMemory,
    bootstrap_addresses,
    load_memory,
    memory_path,
    save_memory,
    updated,
)
from potluck.coordinator.state import SwarmState
from potluck.net.node import SwarmNode
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.errors import BootstrapError
from potluck.protocol.identity import Identity
from potluck.protocol.keys import JobKeys
from potluck.protocol.training import Progress, TrainPlan

logger = logging.getLogger(__name__)

RETRY_S = 1.0  # seconds between two reads of the plan while recovering
MEMORY_REFRESH_S = 60.0  # the swarm memory is rewritten at least this often (peers' last-seen times)


class Memory:
    """The coordinator's swarm memory on disk (``coordinator.memory``): read at start, saved on change."""

    def __init__(self, cfg: CoordinatorConfig, job: str, own_id: str) -> None:
        self.path = memory_path(cfg.identity_path, cfg.swarm_id)
        self.swarm_id, self.job, self.own_id, self.enabled = cfg.swarm_id, job, own_id, cfg.remember
        self.loaded = load_memory(self.path) if cfg.remember else None  # what the last run left
        self._last, self._saved_at = self.loaded, 0.0  # what is on disk; when it was written (monotonic s)

    def save(self, state: SwarmState, plan: TrainPlan | None, finished: bool) -> None:
        """Save the live peers' addresses, ``plan`` and ``finished`` when they changed or
        ``MEMORY_REFRESH_S`` passed; a failure is logged, never raised."""
        if not self.enabled:
            return
        live = [(p, v.record.maddrs) for p, v in state.peers.items()]
        new, changed = updated(
            self._last, self.swarm_id, self.job, live, plan, finished, time.time(), self.own_id
        )
        if not changed and time.monotonic() - self._saved_at < MEMORY_REFRESH_S:
            return
        try:
            save_memory(self.path, new)
        except OSError as e:
            logger.warning("could not save the swarm memory %s: %s", self.path, e)
            return
        self._last, self._saved_at = new, time.monotonic()


async def join(
    identity: Identity, policy: TrustPolicy, cfg: CoordinatorConfig, memory: SwarmMemory | None
) -> tuple[SwarmNode, bool]:
    """Start the coordinator's DHT node; also say whether it joined an existing swarm."""
    key_dir = cfg.identity_path.parent
    remembered = bootstrap_addresses(memory)
    if cfg.initial_peers:  # the user named the swarm: failing to reach it is an error worth stopping for
        node = await SwarmNode.start(
            identity, policy, cfg.net, cfg.initial_peers + remembered, key_dir=key_dir
        )
        return node, True
    if remembered:
        net = dataclasses.replace(
            cfg.net, bootstrap_timeout_s=min(cfg.net.bootstrap_timeout_s, cfg.rejoin_timeout_s)
        )
        try:
            node = await SwarmNode.start(identity, policy, net, remembered, key_dir=key_dir)
            logger.info("rejoined swarm %s through the peers it remembers", cfg.swarm_id)
            return node, True
        except BootstrapError as e:
            logger.warning(
                "none of the %d remembered addresses of swarm %s answered (%s); starting a new DHT",
                len(remembered),
                cfg.swarm_id,
                str(e).splitlines()[0],
            )
    return await SwarmNode.start(identity, policy, cfg.net, (), key_dir=key_dir), False


async def read_recovery(
    node: SwarmNode,
    cfg: CoordinatorConfig,
    job: str,
    saved: TrainPlan | None,
    joined: bool,
    keys: JobKeys | None = None,
) -> Recovery:
    """What to carry on with, from the DHT's plan and progress records and the ``saved`` plan.

    A node that joined nobody has nothing to read. Otherwise the keys are read until they answer; an
    empty answer is believed only after ``recover_empty_reads`` reads in a row (a node that has just
    joined may not have found the records' holders yet). Raises ``CoordinatorError`` when no read
    succeeds within ``recover_timeout_s``."""
    if not joined:
        return recover(job, [], [], saved)
    keys = keys or JobKeys(job)
    deadline = time.monotonic() + cfg.recover_timeout_s
    empty, last_error = 0, ""
    rec: Recovery | None = None
    while True:
        try:
            plans, progress = await bounded(
                asyncio.gather(node.fetch(keys.plan), node.fetch(keys.progress)),
                cfg.read_timeout_s,
                "reading the swarm's plan",
            )
        except Exception as e:  # a slow or failing DHT right after joining: read again
            last_error = str(e) or type(e).__name__
            logger.info("reading the swarm's plan failed: %s; retrying", last_error)
        else:
            rec = recover(
                job,
                [v.record for v in plans if isinstance(v.record, TrainPlan)],
                [v.record for v in progress if isinstance(v.record, Progress)],
                saved,
            )
            empty = 0 if plans or progress else empty + 1
            if empty == 0 or empty >= cfg.recover_empty_reads:
                return rec
        if time.monotonic() + RETRY_S > deadline:
            if rec is not None:  # the DHT answered, only with nothing in it
                return rec
            raise CoordinatorError(
                f"could not read swarm {cfg.swarm_id}'s plan from the DHT within "
                f"{cfg.recover_timeout_s:.0f} s ({last_error}); not planning blindly over a swarm that may "
                "be training under a newer plan. Try again, or give --initial-peers of a live peer."
            )
        await asyncio.sleep(RETRY_S)


async def await_peers(
    read: Callable[[], Awaitable[SwarmState]], placed: Collection[str], timeout_s: float, last: SwarmState
) -> SwarmState:
    """Read the swarm state until every ``placed`` peer heartbeats or ``timeout_s`` passed; the newest
    state read (``last`` if no read succeeded). Right after joining, a read may miss heartbeats."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            last = await read()
        except Exception as e:  # the track-peers loop reads again soon
            logger.info("reading the swarm state failed: %s", e)
        if set(placed) <= set(last.peers) or time.monotonic() + RETRY_S > deadline:
            return last
        await asyncio.sleep(RETRY_S)
