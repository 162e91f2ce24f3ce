"""The coordinator's direct probes of suspects (``job/progress.py`` decides who is one and what a failed
probe means): a crashed peer refuses a dial at once, so a re-plan need not wait out its heartbeat."""

from __future__ import annotations

import asyncio
import logging

from hivemind.p2p import P2P
from hivemind.utils import get_dht_time

from potluck.coordinator.job.progress import JobProgress, RetryPolicy
from potluck.coordinator.state import SwarmState
from potluck.net.dial import reachable

logger = logging.getLogger(__name__)


async def probe_suspects(
    p2p: P2P,
    state: SwarmState,
    progress: JobProgress,
    retry: RetryPolicy,
    probed: dict[str, float],
    timeout_s: float,
) -> None:
    """Dial each pending suspect once per suspicion (``probed``: suspect -> the suspicion's DHT time it
    was probed for, updated here). A peer that answers stays pending (its heartbeat decides); the probes
    run concurrently, each bounded by ``timeout_s``."""
    pending, _ = progress.verdicts(state, get_dht_time(), retry)
    todo = [p for p in pending if probed.get(p) != progress.suspects[p]]
    if not todo:
        return
    answers = await asyncio.gather(
        *(reachable(p2p, p, state.peers[p].record.maddrs, timeout_s) for p in todo)
    )
    now = get_dht_time()
    for peer, ok in zip(todo, answers, strict=True):
        probed[peer] = progress.suspects[peer]
        if not ok:
            logger.info("suspect %s does not answer a direct probe: confirmed", peer[:12])
            progress.probe_failed(peer, now)
