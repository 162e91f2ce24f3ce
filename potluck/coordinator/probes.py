"""The coordinator's direct probes of suspects (``job/progress.py`` decides who is one and what a failed
probe means): a crashed peer refuses a dial at once, so a re-plan need not wait out its heartbeat.

Three things make a peer worth a dial: a failure report naming it (``probe_suspects``), a failed plan
whose reports named nobody (``sweep_failed_plan``), and the coordinator's own daemon losing its
connection to a placed peer (``ConnectionWatch``): a killed process's connections are reset by its
kernel at once, so the daemon knows within a poll, whether or not any peer was waiting on the victim."""

from __future__ import annotations

import asyncio
import logging

from hivemind.p2p import P2P
from hivemind.utils import get_dht_time

from potluck.coordinator.job.progress import JobProgress, RetryPolicy
from potluck.coordinator.state import SwarmState
from potluck.net.dial import reachable
from potluck.protocol.training import TrainPlan

logger = logging.getLogger(__name__)


async def _refusing(p2p: P2P, state: SwarmState, peers: list[str], timeout_s: float) -> list[str]:
    """Those of ``peers`` that do not answer a direct dial at their announced addresses (concurrent
    dials, each bounded by ``timeout_s``)."""
    answers = await asyncio.gather(
        *(reachable(p2p, p, state.peers[p].record.maddrs, timeout_s) for p in peers)
    )
    return [p for p, ok in zip(peers, answers, strict=True) if not ok]


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
    refusing = await _refusing(p2p, state, todo, timeout_s)
    now = get_dht_time()
    for peer in todo:
        probed[peer] = progress.suspects[peer]
    for peer in refusing:
        logger.info("suspect %s does not answer a direct probe: confirmed", peer[:12])
        progress.probe_failed(peer, now)


async def sweep_failed_plan(
    p2p: P2P, state: SwarmState, progress: JobProgress, plan: TrainPlan, swept: set[int], timeout_s: float
) -> list[str]:
    """Once per failed epoch: dial every placed peer of ``plan`` that no failure named and that did not
    report the failure itself; one that refuses becomes a suspect the probe confirmed, so the re-plan
    leaves it out. The first failed record often names nobody (a leader that aborted on its followers'
    word): churn run Q placed a killed peer in the next plan, whose start barrier then waited on it
    (8 s). Live peers are connected already and answer at once. Returns the peers found gone."""
    failed = progress.failed(plan)
    if not failed or plan.epoch in swept:
        return []
    swept.add(plan.epoch)
    reporters = {r.peer_id for r in failed}
    todo = sorted(
        p for p in plan.peers if p not in reporters and p not in progress.suspects and p in state.peers
    )
    gone = await _refusing(p2p, state, todo, timeout_s) if todo else []
    now = get_dht_time()
    for peer in gone:
        logger.info("placed peer %s does not answer a direct probe after a failed step: suspect", peer[:12])
        progress.confirm_gone(peer, now)
    return gone


class ConnectionWatch:
    """Polls the coordinator's daemon for the peers it is connected to; a placed peer whose connection
    went away is dialled, and one that refuses is confirmed gone (``JobProgress.confirm_gone``), so the
    job re-plans without waiting for its heartbeat to expire (churn run T: 10.5-15.9 s after a kill
    nobody had noticed). A connection closed for any other reason (the daemon trimming idle ones, a
    network blip) costs one dial that the peer answers."""

    def __init__(self) -> None:
        self.connected: frozenset[str] = frozenset()

    async def poll(
        self, p2p: P2P, state: SwarmState, progress: JobProgress, plan: TrainPlan | None, timeout_s: float
    ) -> list[str]:
        """One poll (bounded by ``timeout_s`` for the daemon's answer and again for the dials); the
        placed peers found gone. Without a running plan nobody is placed, and the daemon is not asked."""
        if plan is None or plan.status == "done":
            return []
        try:
            infos = await asyncio.wait_for(p2p.list_peers(), timeout_s)
        except Exception as e:  # a daemon that does not answer: no verdict this poll (heartbeats still count)
            logger.info("the daemon did not list its connections: %s", e or type(e).__name__)
            return []
        now_connected = frozenset(info.peer_id.to_base58() for info in infos)
        before, self.connected = self.connected, now_connected
        # Each loss is dialled once: a dead peer is never connected again, so never lost again.
        todo = sorted(p for p in plan.peers if p in before and p not in now_connected and p in state.peers)
        if not todo:
            return []
        gone = await _refusing(p2p, state, todo, timeout_s)
        at = get_dht_time()
        for peer in gone:
            logger.info("placed peer %s: its connection closed and it refuses a dial: gone", peer[:12])
            progress.confirm_gone(peer, at)
        return gone
