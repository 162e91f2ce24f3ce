"""The peer daemon's lifecycle: join, probe, announce a heartbeat, and leave cleanly within a bound.

The heartbeat, the link rounds and the worker run as named tasks under ``aio.supervise``: a crash of
one is logged with its name and stops the others. ``run`` returns only after they have ended (each
within ``TASK_GRACE_S`` of being cancelled) and the p2p daemon is gone.

Leaving is graceful: a stop request (SIGTERM, Ctrl-C) withdraws the heartbeat at once (a signed
"leaving" record that outlives the last online one, so the swarm sees the departure without waiting a
TTL) but keeps training and serving this peer's state until the coordinator's new plan without it is
under way, at most ``leave_timeout_s`` (``peer/leave.py`` decides). A second request leaves at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Coroutine
from typing import Any

from hivemind.utils import get_dht_time

from potluck import logs
from potluck.aio import bounded, supervise
from potluck.net.admit import ask_admission
from potluck.net.dial import dht_addresses
from potluck.net.links import LinkProber, choose_targets, uplink_bytes_s
from potluck.net.node import SwarmNode
from potluck.net.reachout import dial_public
from potluck.net.streams import Streams
from potluck.peer.config import PeerConfig
from potluck.peer.errors import PeerError
from potluck.peer.kinds import PIPELINE, JobKinds, KindWorker, Seat, swarm_kind
from potluck.peer.leave import LeaveView, leave_verdict
from potluck.peer.probe import apply_caps, pick_device, probe
from potluck.peer.telemetry import PeerTelemetry, peer_metrics
from potluck.peer.worker import PlanWorker
from potluck.protocol.admission import Admission
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.errors import AdmissionError, WireError
from potluck.protocol.identity import Identity, peer_id_from_public_key
from potluck.protocol.keys import LINKS, PEERS
from potluck.protocol.membership import live_peers
from potluck.protocol.records import AccessLink, Hardware, LinkReport, LinkSample, PeerRecord
from potluck.telemetry.http import serve_metrics

logger = logging.getLogger(__name__)

TASK_GRACE_S = 1.0  # seconds a cancelled task may spend unwinding before the leave goes on without it
SWARM_POLL_S = 5.0  # most seconds between two "is anyone still there?" checks
LEAVE_POLL_S = 1.0  # seconds between two looks at the hand-off while leaving
ADMIT_TIMEOUT_S = 10.0  # bound on one admission request to the coordinator
LEAVE_READ_S = 5.0  # bound on one read of the swarm while leaving
MEMBERS_READ_EVERY_S = 1.0  # an unknown prober costs at most one read of the swarm's members a second
DIAL_OUT_S = 2.0  # behind a NAT: seconds between two rounds of dialling the public peers
DIAL_OUT_TIMEOUT_S = 5.0  # bound on one round's dials


class PeerDaemon:
    def __init__(
        self, cfg: PeerConfig, identity: Identity | None = None, kinds: JobKinds | None = None
    ) -> None:
        """``kinds``: the job kinds this peer can run besides the built-in pipeline (``peer/kinds.py``)."""
        self.cfg = cfg
        self.kinds: JobKinds = kinds or {}
        self.identity = identity or Identity.load_or_create(cfg.identity_path)
        self.policy = TrustPolicy(cfg.invite.swarm_id, cfg.invite.coordinator_key, require_admission=True)
        self.admission: Admission | None = None  # the coordinator's, renewed at half its life
        self._admitted_for = 0.0  # seconds the current admission was granted for
        self.node: SwarmNode | None = None
        self.hardware: Hardware | None = None
        self.stop_event = asyncio.Event()  # set: leave gracefully (hand the work over first)
        self.leave_now = asyncio.Event()  # set: leave without waiting for the hand-off
        self._gone = asyncio.Event()  # set once the hand-off is over: the tasks stop
        self.ready = asyncio.Event()  # set once the first heartbeat is stored
        self.prober: LinkProber
        self.link_reports = 0  # link reports published so far
        self.worker: PlanWorker | None = None  # the pipeline's worker, when the swarm runs that kind
        self.kind_worker: KindWorker | None = None  # the worker of another kind, when it runs one
        self.swarm_gone = False  # set when the daemon left because nobody else was visible
        self.alone = False  # the last look found neither the coordinator nor another peer
        self.link_samples: dict[str, LinkSample] = {}  # peer -> the newest measurement of our link to it
        self._members: frozenset[str] = frozenset()  # live admitted peers, as last read (probe gate)
        self._members_at = -MEMBERS_READ_EVERY_S
        self._members_lock = asyncio.Lock()
        self.telemetry = PeerTelemetry(
            self.identity,
            cfg.invite.swarm_id,
            cfg.telemetry,
            hardware=lambda: self.hardware,
            worker=lambda: self.worker,
            links=lambda: self.link_samples,
            leaving=self.stop_event.is_set,
            alone=lambda: self.alone,
        )

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    async def run(self) -> None:
        """Join and heartbeat until ``stop()``; then leave within ``cfg.shutdown_timeout_s``."""
        logs.bind(peer_id=self.peer_id, swarm_id=self.cfg.invite.swarm_id)
        device = pick_device(self.cfg.device)
        # The probe is CPU/GPU-bound: run it off the loop while the node bootstraps.
        shared = self.cfg.cotenant is not None  # this device also runs a co-tenant peer (--share-device)
        probe_task = asyncio.create_task(
            asyncio.to_thread(
                probe,
                device,
                self.cfg.probe_budget_s,
                self.cfg.slots,
                # the pair speedup: for two slots or a shared device, unless the volunteer declared it
                (self.cfg.slots == 2 or shared) and self.cfg.pair_speedup is None,
                self.cfg.threads if shared else None,
            ),
            name="probe",
        )
        try:
            self.node = await SwarmNode.start(
                self.identity,
                self.policy,
                self.cfg.net,
                self.cfg.invite.bootstrap,
                key_dir=self.cfg.identity_path.parent,
            )
            await self._admit(self.cfg.net.bootstrap_timeout_s)  # before anything is published
            self.hardware = apply_caps(await probe_task, self.cfg.threads, self.cfg.max_memory_bytes, device)
            if self.cfg.pair_speedup is not None:  # the volunteer's own figure, not probed
                self.hardware = self.hardware.model_copy(update={"pair_speedup": self.cfg.pair_speedup})
        except BaseException:
            probe_task.cancel()
            with contextlib.suppress(BaseException):
                await probe_task
            raise
        logger.info("peer %s joined swarm %s", self.peer_id, self.cfg.invite.swarm_id)
        self.prober = LinkProber(
            self.node.p2p,
            self.cfg.invite.swarm_id,
            self.cfg.links,
            addresses=dht_addresses(self.node),
            allow=self._may_probe,
        )
        await self.prober.serve()
        tasks: dict[str, Coroutine[Any, Any, None]] = {
            "heartbeat": self._heartbeat(),
            "admission": self._keep_admitted(),
            "links": self._measure_links(),
            "hand-off": self._hand_off(),
            "telemetry": self.telemetry.run(),
        }
        if self.cfg.metrics_bind is not None:
            tasks["metrics"] = serve_metrics(*self.cfg.metrics_bind, self._metrics_text)
        if self.node.behind_nat:
            tasks["dial-out"] = self._dial_out()
        if self.cfg.swarm_gone_after_s is not None:
            tasks["swarm-watch"] = self._watch_swarm(self.cfg.swarm_gone_after_s)
        if self.cfg.train:
            tasks["work"] = self._work(device)
        hw = self.hardware
        self.telemetry.event("joined", f"{hw.label}, {hw.tflops_fp32:.2f} TFLOP/s fp32", {})
        try:
            await supervise(tasks, until=self._gone, grace_s=TASK_GRACE_S)
        finally:
            await self._leave()

    async def _work(self, device: object) -> None:
        """Read the swarm's job kind, then run that kind's worker until cancelled."""
        assert self.node is not None
        kind = await swarm_kind(self.node)
        if kind != PIPELINE and self.cfg.cotenant_of is not None:
            logger.info("a co-tenant serves pipeline leases only; nothing to do in a %s swarm", kind)
            return
        await self._start_worker(kind, device)

    def _start_worker(self, kind: str, device: object) -> Coroutine[Any, Any, None]:
        """The run of ``kind``'s worker: the built-in pipeline's, or one the daemon was handed."""
        assert self.node is not None
        wcfg = dataclasses.replace(self.cfg.worker, device=str(device), precision=self.cfg.precision)
        owner = peer_id_from_public_key(self.cfg.invite.coordinator_key)
        cotenant = self.cfg.cotenant_of is not None
        if kind == PIPELINE:
            self.worker = PlanWorker(
                self.node,
                self.peer_id,
                self.cfg.invite.swarm_id,
                wcfg,
                self.identity,
                owner,
                cotenant,
                uplink=self._uplink_bytes_s,
            )
            self.worker.activity.on_event = self.telemetry.event
            return self.worker.run()
        if kind not in self.kinds:
            raise PeerError(f"the swarm runs a {kind!r} job, which this peer cannot run")
        seat = Seat(self.node, self.cfg.invite.swarm_id, self.identity, self.policy, owner, cotenant, wcfg)
        self.kind_worker = self.kinds[kind](seat)
        logger.info("the swarm runs a %s job", kind)
        return self.kind_worker.run()

    def _metrics_text(self) -> bytes:
        return peer_metrics(self.telemetry.snapshot())

    def stop(self) -> None:
        """Leave: the first call hands this peer's work over first, a second one leaves at once."""
        if self.stop_event.is_set():
            self.leave_now.set()
        self.stop_event.set()

    async def _record(self, status: str) -> PeerRecord:
        assert self.node is not None and self.hardware is not None
        return PeerRecord(
            peer_id=self.peer_id,
            status=status,  # type: ignore[arg-type]
            hardware=self.hardware,
            maddrs=(await self.node.visible_maddrs())[:16],
            issued_at=get_dht_time(),
            behind_nat=self.node.behind_nat,
            cotenant=self.cfg.cotenant,
            cotenant_of=self.cfg.cotenant_of,
        )

    async def _admit(self, within_s: float) -> None:
        """Trade the invite's token for an admission at the coordinator; retried while it cannot be
        reached (it may be restarting), for ``within_s``. ``AdmissionError``: refused, with its reason."""
        assert self.node is not None
        coordinator = peer_id_from_public_key(self.cfg.invite.coordinator_key)
        streams, swarm = Streams(self.node.p2p), self.cfg.invite.swarm_id
        deadline, delay = time.monotonic() + within_s, 0.5
        while True:
            try:
                adm = await ask_admission(streams, coordinator, swarm, self.cfg.invite.token, ADMIT_TIMEOUT_S)
                break
            except WireError as e:  # unreachable or silent: not a refusal
                if time.monotonic() + delay > deadline:
                    raise AdmissionError(
                        f"the coordinator did not answer an admission request: {e}"
                    ) from None
                await asyncio.sleep(delay)
                delay = min(2 * delay, 5.0)
        self.admission, self._admitted_for = adm, adm.expires - get_dht_time()
        self.node.admission = adm.encode()
        logger.info("admitted to swarm %s until %s", swarm, time.ctime(adm.expires))

    async def _keep_admitted(self) -> None:
        """Renew the admission at half its life, and read the swarm's ban list; a banned peer leaves."""
        assert self.node is not None
        while True:
            try:
                bans = await bounded(self.node.read_bans(), self.cfg.heartbeat_interval_s, "ban list")
                self.policy.banned.clear()  # the list as it stands (it is the same set the worker reads)
                self.policy.banned.update(bans)
                if self.peer_id in self.policy.banned:
                    logger.error("this peer is banned from swarm %s; leaving", self.cfg.invite.swarm_id)
                    self.leave_now.set()
                    self.stop()
                    return
                assert self.admission is not None
                if self.admission.expires - get_dht_time() < self._admitted_for / 2:
                    await self._admit(self.cfg.heartbeat_interval_s * 3)
            except AdmissionError as e:
                logger.warning("admission not renewed: %s", e)
            except Exception:  # a failed read is retried at the next beat
                logger.exception("keeping the admission failed")
            await asyncio.sleep(self.cfg.heartbeat_interval_s)

    async def _heartbeat(self) -> None:
        assert self.node is not None
        while True:
            started = time.monotonic()
            # Once leaving, the record says so (and outlives the last "online" one, so it wins).
            leaving = self.stop_event.is_set()
            status, ttl = ("leaving", self.cfg.ttl_s + 1.0) if leaving else ("online", self.cfg.ttl_s)
            try:
                ok = await bounded(
                    self.node.publish(PEERS.name, await self._record(status), ttl, self.peer_id),
                    self.cfg.heartbeat_interval_s,
                    "heartbeat store",
                )
                if ok and not leaving:
                    self.ready.set()
                elif not ok:
                    logger.warning("heartbeat was not stored by any DHT node; retrying")
            except TimeoutError as e:
                logger.warning("%s", e)
            delay = max(0.0, self.cfg.heartbeat_interval_s - (time.monotonic() - started))
            if leaving:
                await asyncio.sleep(delay)
            else:  # a stop request is announced at once, not at the next beat
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop_event.wait(), delay)

    def _uplink_bytes_s(self) -> float | None:
        """This peer's uplink, bytes/s, as declared or last measured (``net.links.uplink_bytes_s``)."""
        return uplink_bytes_s(self.cfg.links.upload_mbps, self.link_samples.values())

    def _access(self) -> AccessLink:
        """The declared access link, in the report's units (Gbit/s)."""
        up, down = self.cfg.links.upload_mbps, self.cfg.links.download_mbps
        return AccessLink(
            upload_gbps=None if up is None else up / 1e3, download_gbps=None if down is None else down / 1e3
        )

    async def _measure_links(self) -> None:
        """Every ``links.interval_s``: measure a sample of live peers and publish a signed LinkReport."""
        assert self.node is not None
        cfg = self.cfg.links
        await asyncio.sleep(min(cfg.interval_s, 2.0))  # let the first heartbeats of a new swarm land
        round_no = 0
        while True:
            try:
                peers = live_peers(await self.node.fetch(PEERS.name), get_dht_time())
                self._members, self._members_at = frozenset(p.peer_id for p in peers), time.monotonic()
                targets = choose_targets(self.peer_id, [p.peer_id for p in peers], round_no, cfg.sample_size)
                samples: list[LinkSample] = []
                for target in targets:
                    try:
                        sample = await self.prober.measure(target)
                        samples.append(sample)
                        self.link_samples[target] = sample
                    except WireError as e:
                        logger.info("link to %s not measured: %s", target, e)
                inbound = list(self.prober.inbound.values())  # what others' probes showed here
                if samples or inbound:
                    now = get_dht_time()
                    report = LinkReport(
                        peer_id=self.peer_id,
                        links=samples,
                        inbound=inbound,
                        issued_at=now,
                        access=self._access(),
                    )
                    ttl = min(3 * cfg.interval_s, LINKS.max_ttl_s)
                    await self.node.publish(LINKS.name, report, ttl, self.peer_id)
                    self.link_reports += 1
            except Exception:  # measurement is best effort; the daemon carries on
                logger.exception("link measurement round %d failed", round_no)
            round_no += 1
            await asyncio.sleep(cfg.interval_s)

    async def _dial_out(self) -> None:
        """Behind a NAT: keep a direct connection to every public peer (``net/reachout.py``), checked
        every ``DIAL_OUT_S`` so newcomers are dialled before they reach us through a relay."""
        assert self.node is not None
        while True:
            try:
                peers = live_peers(await self.node.fetch(PEERS.name), get_dht_time())
                await dial_public(self.node.p2p, self.peer_id, [p.record for p in peers], DIAL_OUT_TIMEOUT_S)
            except Exception as e:  # best effort: a relay still carries what a direct dial would
                logger.info("dialling public peers failed: %s", e)
            await asyncio.sleep(DIAL_OUT_S)

    async def _watch_swarm(self, limit_s: float) -> None:
        """Stop the daemon once nobody else has been visible for ``limit_s`` seconds.

        Why: a peer whose coordinator and fellow peers are all gone (a crashed demo, a swarm shut down
        while it was unreachable) would otherwise retry plan reads, pipeline receives and link rounds
        forever, burning CPU for nobody. A failed check counts as "nobody", so a dead p2pd ends it too."""
        poll_s = min(SWARM_POLL_S, limit_s / 4)
        last_seen = time.monotonic()
        while True:
            await asyncio.sleep(poll_s)
            try:
                seen = await bounded(self._anyone_visible(), max(poll_s, 1.0), "swarm visibility check")
            except Exception as e:  # p2pd gone, DHT unreachable: expected in exactly this situation
                logger.info("swarm visibility check failed: %s", e)
                seen = False
            now = time.monotonic()
            self.alone = not seen
            if seen:
                last_seen = now
            elif now - last_seen >= limit_s:
                logger.warning(
                    "swarm %s is gone: no coordinator and no other peer visible for %.0f s; leaving",
                    self.cfg.invite.swarm_id,
                    now - last_seen,
                )
                self.swarm_gone = True
                self.stop()
                return

    async def _may_probe(self, peer: str) -> bool:
        """Link probes cost upload: serve them to the swarm's live, admitted, unbanned peers only."""
        if peer in self.policy.banned:
            return False
        if peer in self._members:
            return True
        async with self._members_lock:
            stale = time.monotonic() - self._members_at >= MEMBERS_READ_EVERY_S
            if peer not in self._members and stale and self.node is not None:
                self._members_at = time.monotonic()
                try:
                    found = await bounded(self.node.fetch(PEERS.name), LEAVE_READ_S, "reading the peers")
                except Exception as e:  # unreadable swarm: refuse, the prober tries again next round
                    logger.info("cannot tell whether %s may probe: %s", peer, e)
                    return False
                self._members = frozenset(p.peer_id for p in live_peers(found, get_dht_time()))
        return peer in self._members

    async def _anyone_visible(self) -> bool:
        """True if p2pd holds a connection to anyone, or another peer's heartbeat is live in the DHT."""
        assert self.node is not None
        if await self.node.p2p.list_peers():  # local RPC to our p2pd: the cheap check first
            return True
        peers = live_peers(await self.node.fetch(PEERS.name), get_dht_time())
        return any(p.peer_id != self.peer_id for p in peers)

    async def _hand_off(self) -> None:
        """Once asked to stop: train and serve on until this peer's work is handed over (``leave_verdict``),
        ``leave_timeout_s`` passed or a second stop came; then end the daemon's tasks."""
        await self.stop_event.wait()
        self.telemetry.event("left", "leaving: handing its work over first", {})
        since = time.monotonic()
        worker = self.worker
        plan = worker.plan if worker is not None else None  # the plan it follows, not one it trains toward
        placed = plan is not None and plan.status == "training" and plan.position(self.peer_id) is not None
        placed = placed or (worker is not None and worker.running())
        said = ""
        while not self.leave_now.is_set():
            try:
                view = await bounded(self._leave_view(since, placed), LEAVE_READ_S, "reading the swarm")
                decision, why = leave_verdict(view, time.monotonic(), self.cfg.leave_timeout_s)
            except TimeoutError as e:  # p2pd gone, DHT unreachable: nobody to hand over to
                decision, why = "go", f"the swarm is not readable ({e})"
            except Exception:
                logger.exception("reading the swarm while leaving failed")
                decision, why = "go", "the swarm is not readable"
            if decision == "go":
                logger.info("leaving: %s", why)
                break
            if why != said:  # a volunteer who pressed Ctrl-C wants to know why it is not quitting yet
                left = self.cfg.leave_timeout_s - (time.monotonic() - since)
                logger.warning("leaving: %s (at most %.0f s more; Ctrl-C again to leave now)", why, left)
                said = why
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.leave_now.wait(), LEAVE_POLL_S)
        if self.leave_now.is_set():
            logger.warning("leaving now, without waiting for the hand-off")
        self._gone.set()

    async def _leave_view(self, since: float, placed_at_start: bool) -> LeaveView:
        assert self.node is not None
        worker = self.worker
        plan = worker.newest_plan() if worker is not None else None
        peers = live_peers(await self.node.fetch(PEERS.name), get_dht_time())
        placed = plan is not None and plan.position(self.peer_id) is not None
        running = worker is not None and worker.running()
        under_way = False
        if worker is not None and plan is not None and not placed and not running:
            under_way = await worker.under_way(plan)
        done = plan is not None and plan.status == "done"
        others = sum(1 for p in peers if p.peer_id != self.peer_id)
        return LeaveView(since, placed_at_start, placed, running, under_way, done, others)

    async def _leave(self) -> None:
        """Withdraw the heartbeat, then stop the node; bounded by ``shutdown_timeout_s`` in total."""
        if self.node is None:
            return
        node, deadline = self.node, time.monotonic() + self.cfg.shutdown_timeout_s
        # The retained status says "offline" (a death would leave it to the broker's last will).
        await self.telemetry.goodbye(min(2.0, self.cfg.shutdown_timeout_s / 2))
        try:
            # The "leaving" record expires after the last "online" one, so it wins in the DHT.
            await bounded(
                node.publish(PEERS.name, await self._record("leaving"), self.cfg.ttl_s + 1.0, self.peer_id),
                self.cfg.withdraw_timeout_s,
                "withdrawing the heartbeat",
            )
        except TimeoutError as e:
            logger.warning("%s; it expires within %.0f s", e, self.cfg.ttl_s)
        except Exception:
            logger.exception("could not withdraw the heartbeat; it expires within %.0f s", self.cfg.ttl_s)
        try:
            await bounded(node.shutdown(), max(0.5, deadline - time.monotonic()), "p2p shutdown")
        except TimeoutError as e:
            logger.warning("%s; killing the daemon", e)
            node.kill()
        self.node = None
