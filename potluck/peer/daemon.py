"""The peer daemon's lifecycle: join, probe, announce a heartbeat, and leave cleanly within a bound.

Tasks are named and owned here; ``run`` returns only after they are cancelled and the p2p daemon is
gone. A stop request withdraws the heartbeat (a signed "leaving" record that outlives the last online
one) so the swarm sees the departure at once instead of after a TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import time

import torch
from hivemind.utils import get_dht_time

from potluck.net.links import LinkProber, choose_targets
from potluck.net.node import SwarmNode
from potluck.peer.config import PeerConfig
from potluck.peer.probe import pick_device, probe
from potluck.peer.worker import PlanWorker
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.errors import WireError
from potluck.protocol.identity import Identity
from potluck.protocol.keys import LINKS, PEERS
from potluck.protocol.membership import live_peers
from potluck.protocol.records import Hardware, LinkReport, LinkSample, PeerRecord

logger = logging.getLogger(__name__)


class PeerDaemon:
    def __init__(self, cfg: PeerConfig, identity: Identity | None = None) -> None:
        self.cfg = cfg
        self.identity = identity or Identity.load_or_create(cfg.identity_path)
        self.policy = TrustPolicy(cfg.invite.swarm_id, cfg.invite.coordinator_key)
        self.node: SwarmNode | None = None
        self.hardware: Hardware | None = None
        self.stop_event = asyncio.Event()
        self.ready = asyncio.Event()  # set once the first heartbeat is stored
        self.prober: LinkProber
        self.link_reports = 0  # link reports published so far
        self.worker: PlanWorker | None = None

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    async def run(self) -> None:
        """Join and heartbeat until ``stop()``; then leave within ``cfg.shutdown_timeout_s``."""
        device = pick_device(self.cfg.device)
        # The probe is CPU/GPU-bound: run it off the loop while the node bootstraps.
        probe_task = asyncio.create_task(
            asyncio.to_thread(probe, device, self.cfg.probe_budget_s), name="probe"
        )
        try:
            self.node = await SwarmNode.start(
                self.identity,
                self.policy,
                self.cfg.net,
                self.cfg.invite.bootstrap,
                key_dir=self.cfg.identity_path.parent,
            )
            self.hardware = self._capped(await probe_task)
        except BaseException:
            probe_task.cancel()
            with contextlib.suppress(BaseException):
                await probe_task
            raise
        logger.info("peer %s joined swarm %s", self.peer_id, self.cfg.invite.swarm_id)
        self.prober = LinkProber(self.node.p2p, self.cfg.invite.swarm_id, self.cfg.links)
        await self.prober.serve()
        tasks = [
            asyncio.create_task(self._heartbeat(), name="heartbeat"),
            asyncio.create_task(self._measure_links(), name="links"),
        ]
        if self.cfg.train:
            wcfg = dataclasses.replace(self.cfg.worker, device=str(device))
            self.worker = PlanWorker(self.node, self.peer_id, self.cfg.invite.swarm_id, wcfg)
            tasks.append(asyncio.create_task(self.worker.run(), name="train"))
        try:
            await self.stop_event.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self._leave()

    def _capped(self, hw: Hardware) -> Hardware:
        """Apply --threads and --max-memory: the swarm plans with what this peer offers, not all it has."""
        if self.cfg.threads is not None:
            torch.set_num_threads(self.cfg.threads)
        cap = self.cfg.max_memory_bytes
        if cap is None:
            return hw
        if hw.device_kind == "cuda" and hw.memory_total_bytes:
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / hw.memory_total_bytes))
        return hw.model_copy(update={"memory_free_bytes": min(hw.memory_free_bytes, cap)})

    def stop(self) -> None:
        self.stop_event.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop)

    async def _record(self, status: str) -> PeerRecord:
        assert self.node is not None and self.hardware is not None
        return PeerRecord(
            peer_id=self.peer_id,
            status=status,  # type: ignore[arg-type]
            hardware=self.hardware,
            maddrs=(await self.node.visible_maddrs())[:16],
            issued_at=get_dht_time(),
        )

    async def _heartbeat(self) -> None:
        assert self.node is not None
        while True:
            started = time.monotonic()
            try:
                ok = await asyncio.wait_for(
                    self.node.publish(PEERS.name, await self._record("online"), self.cfg.ttl_s, self.peer_id),
                    timeout=self.cfg.heartbeat_interval_s,
                )
                if ok:
                    self.ready.set()
                else:
                    logger.warning("heartbeat was not stored by any DHT node; retrying")
            except TimeoutError:
                logger.warning("heartbeat store timed out after %.1f s", self.cfg.heartbeat_interval_s)
            await asyncio.sleep(max(0.0, self.cfg.heartbeat_interval_s - (time.monotonic() - started)))

    async def _measure_links(self) -> None:
        """Every ``links.interval_s``: measure a sample of live peers and publish a signed LinkReport."""
        assert self.node is not None
        cfg = self.cfg.links
        await asyncio.sleep(min(cfg.interval_s, 2.0))  # let the first heartbeats of a new swarm land
        round_no = 0
        while True:
            try:
                peers = live_peers(await self.node.fetch(PEERS.name), get_dht_time())
                targets = choose_targets(self.peer_id, [p.peer_id for p in peers], round_no, cfg.sample_size)
                samples: list[LinkSample] = []
                for target in targets:
                    try:
                        samples.append(await self.prober.measure(target))
                    except WireError as e:
                        logger.info("link to %s not measured: %s", target, e)
                if samples:
                    report = LinkReport(peer_id=self.peer_id, links=samples, issued_at=get_dht_time())
                    ttl = min(3 * cfg.interval_s, LINKS.max_ttl_s)
                    await self.node.publish(LINKS.name, report, ttl, self.peer_id)
                    self.link_reports += 1
            except Exception as e:  # measurement is best effort; the daemon carries on
                logger.warning("link measurement round %d failed: %s", round_no, e)
            round_no += 1
            await asyncio.sleep(cfg.interval_s)

    async def _leave(self) -> None:
        """Withdraw the heartbeat, then stop the node; bounded by ``shutdown_timeout_s`` in total."""
        if self.node is None:
            return
        node, deadline = self.node, time.monotonic() + self.cfg.shutdown_timeout_s
        try:
            # The "leaving" record expires after the last "online" one, so it wins in the DHT.
            await asyncio.wait_for(
                node.publish(PEERS.name, await self._record("leaving"), self.cfg.ttl_s + 1.0, self.peer_id),
                timeout=self.cfg.withdraw_timeout_s,
            )
        except (TimeoutError, Exception) as e:
            logger.warning("could not withdraw heartbeat (%s); it expires within %.0f s", e, self.cfg.ttl_s)
        try:
            await asyncio.wait_for(node.shutdown(), timeout=max(0.5, deadline - time.monotonic()))
        except TimeoutError:
            logger.warning("p2p shutdown exceeded its bound; killing the daemon")
            node.kill()
        self.node = None
