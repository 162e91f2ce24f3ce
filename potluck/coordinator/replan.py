"""From a decision to a published plan, for the pipeline kind: where to resume, whom to leave out, which
placement, and the newcomers' price. A restarted coordinator's recovery lands here too.

``Replanner.replan`` reads the disk for the owner's newest checkpoint, waits a few seconds for live
peers' reports when they hold newer state than any complete checkpoint (``RESUME_SETTLE_S``), moves a
hand-off's start ahead so the old plan's peers stop there together, and plans off the loop
(``make_train_plan``). Each choice is made by a pure function of ``job/``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from typing import Literal

from hivemind.utils import get_dht_time

from potluck.coordinator import rejoin
from potluck.coordinator.events import PeersChanged, PlanPublished
from potluck.coordinator.job.codecs import MeasuredRatios
from potluck.coordinator.job.handoff import handoff_step, typical_step_s
from potluck.coordinator.job.improve import ImproveConfig
from potluck.coordinator.job.joins import JoinDesk
from potluck.coordinator.job.plan import device_of, make_train_plan
from potluck.coordinator.job.progress import JobProgress, RetryPolicy
from potluck.coordinator.job.resume import choose_resume, start_holders, unheard_survivors
from potluck.coordinator.job.speeds import MeasuredSpeeds
from potluck.coordinator.kinds import JobHost
from potluck.coordinator.placement import PlacementPlan
from potluck.protocol.checkpoints import latest_complete, manifest_path, read_manifest
from potluck.protocol.training import Progress, Spare, TrainPlan

logger = logging.getLogger(__name__)

RESUME_SETTLE_S = 10.0  # longest a re-plan waits for live peers to report state newer than it found
# Longest a repair waits for the survivors' own reports of their failed step (s), and how often it reads
# them meanwhile: they stop within a tenth of a second of a death (their streams from it end) and report
# at once, while their last reports before that lag up to ``progress_interval_s`` of steps behind.
SURVIVORS_S, SURVIVORS_POLL_S = 1.5, 0.25


class Replanner:
    """The pipeline's plan in force, what it was planned from, and how the next one is made."""

    def __init__(self, host: JobHost) -> None:
        self.host, cfg = host, host.cfg
        self.plan: TrainPlan | None = None
        self.placement: PlacementPlan | None = None
        self.progress = JobProgress()
        self.retry = RetryPolicy(max_backoff_s=cfg.max_backoff_s, slack_s=cfg.suspect_slack_s)
        improve = ImproveConfig(restart_s=cfg.join_restart_s, margin=cfg.join_margin)
        self.joins = JoinDesk(cfg.join_check_s, cfg.join_recheck_s, improve)  # peers that came later
        self.speeds = MeasuredSpeeds()  # TFLOP/s measured on this job, and the peers that overclaim
        self.ratios = MeasuredRatios()  # activation codec ratios measured on this job (job/codecs.py)
        self.resume_from: Literal["live", "checkpoint"] = "live"  # of the newest resume point
        self._enough_since: float | None = None  # when min_peers were first live (monotonic s)
        self._settle_since: float | None = None  # when a re-plan began waiting for live peers' reports
        self._resume_reason = ""

    async def publish(self, plan: TrainPlan) -> None:
        """Make ``plan`` the one in force and store it (the driver refreshes it every third of its TTL)."""
        host = self.host
        assert host.node is not None
        # Its peers, its spares and the peers of the plan it replaces get it pushed as well as stored
        # (net/push.py): a plan poll and a DHT read cost each of them up to seconds a re-plan waits on.
        old, live = self.plan, set(host.state.peers)
        told = {
            *plan.peers,
            *(s.peer_id for s in plan.spares),
            *(old.peers if old is not None else ()),
        } & live
        self.plan = plan
        if not await host.node.publish(host.keys.plan, plan, host.cfg.plan_ttl_s, push_to=told):
            logger.warning("plan epoch %d stored by no DHT node yet", plan.epoch)

    def published(self, plan: TrainPlan, reason: str) -> None:
        self.host.events.emit(PlanPublished(plan, reason))

    async def read_progress(self) -> None:
        host = self.host
        assert host.node is not None
        records = [v.record for v in await host.node.fetch(host.keys.progress)]
        self.progress.update(self.plan, [r for r in records if isinstance(r, Progress)])

    def measured_speeds(self) -> dict[str, float]:
        peers = self.host.state.peers
        claims = {p: device_of(v.record).tflops for p, v in peers.items()}
        devices = {p: v.record.hardware.label for p, v in peers.items()}
        return self.speeds.update(self.plan, self.host.job, self.progress.compute_s, claims, devices)

    async def recover(self, saved: TrainPlan | None, joined: bool) -> None:
        """Carry on with the plan the swarm follows and its progress (``job.recover`` decides), and wait
        (``recover_peers_s`` at most) for its placed peers' heartbeats, so that the first round does not
        take peers that are training for gone."""
        host, job = self.host, self
        assert host.node is not None
        rec = await rejoin.read_recovery(host.node, host.cfg, host.job.name, saved, joined, host.keys)
        host.first_epoch = rec.next_epoch
        if rec.next_epoch > 1:
            logger.info("recovered: %s; the next plan is epoch %d", rec.reason, rec.next_epoch)
        if rec.plan is None:
            return
        job.plan, job.progress, host.last_reason = rec.plan, rec.progress, f"recovered {rec.reason}"
        placed = {p for st in rec.plan.stages for p in st.peers}
        host.state = await rejoin.await_peers(host.read_state, placed, host.cfg.recover_peers_s, host.state)
        if host.state.peers:
            host.events.emit(PeersChanged(host.state, sorted(host.state.peers), []))
        if rec.from_saved:  # the plan record expired while we were away: peers that restart need it
            await job.publish(rec.plan.model_copy(update={"issued_at": get_dht_time()}))

    def resume_step(self, live_peers: Collection[str]) -> int:
        """The step live peers hold in memory (when together they hold every layer and live state has
        not just failed), else the newest checkpoint: the job owner's copy on this machine, or the newest
        step whose every layer live peers reported keeping (until that, too, failed once).
        Reads the disk here; ``job.resume.choose_resume`` decides."""
        host, job = self.host, self
        root = host.checkpoint_root
        on_disk = latest_complete(root)
        meta = read_manifest(manifest_path(on_disk.path, 0), on_disk.step, 0).meta if on_disk else None
        # Peers' own disks, as their reports suggest (any live peer's: one leased to another job still
        # serves them); once that failed too, the owner's copy if there is one.
        disks = set(live_peers) | set(host.swarm.peers)
        point = choose_resume(host.job, job.plan, job.progress, live_peers, disks, meta)
        if point.ignored is not None:
            logger.warning("%s %s; not resuming from it", root, point.ignored)
        if point.reason != self._resume_reason:  # asked every round until a plan is made: say it once
            logger.info("resume at step %d: %s", point.step, point.reason)
            self._resume_reason = point.reason
        self.resume_from = "checkpoint" if point.from_checkpoint else "live"
        return point.step

    async def _await_survivors(self, plan: TrainPlan) -> list[str]:
        """A running plan lost a peer: give its live peers up to ``SURVIVORS_S`` to report their run's end
        (``job.resume.unheard_survivors``) before the repair picks its start. Returns the peers excluded
        when it began: the survivors' reports name the victim a suspect again, later than this
        coordinator's probe found it gone, which would make the repair wait on it as merely suspected
        (churn run G placed a dead peer once this way)."""
        job = self
        deadline = time.monotonic() + SURVIVORS_S
        told, first = False, None
        while time.monotonic() < deadline:
            _, excluded = job.progress.verdicts(self.host.state, get_dht_time(), job.retry)
            first = excluded if first is None else first
            # the victim may heartbeat for seconds yet; the survivors' reports re-suspect it (not gone)
            live = set(self.host.state.peers) - {*first, *excluded}
            if not unheard_survivors(plan, job.progress, live):
                break
            gone = sorted(p for p in plan.peers if p not in live)
            if not told and gone and gone != plan.gone:
                # Tell them who is gone (the same epoch re-published, pushed): their waits on it fail now.
                # Churn run F: survivors waited 2 s on a victim their own checks had not found gone yet,
                # while this coordinator's probe had, and the repair started from their stale reports.
                await job.publish(plan.model_copy(update={"gone": gone, "issued_at": get_dht_time()}))
            told = True
            await asyncio.sleep(SURVIVORS_POLL_S)
            await job.read_progress()
        return first or []

    def _links_pending(self) -> bool:
        """Before the first plan: give the peers' first link reports up to ``link_wait_s`` to arrive."""
        host = self.host
        if self.plan is not None or len(host.state.peers) < host.job.min_peers:
            self._enough_since = None
            return False
        now = time.monotonic()
        self._enough_since = self._enough_since or now
        reported = sum(1 for p in host.state.peers if p in host.state.links)
        return reported < len(host.state.peers) and now - self._enough_since < host.cfg.link_wait_s

    def _handoff_start(self, start: int) -> int:
        """``start`` moved ahead for a re-plan nothing failed for, when it came from live state (not from
        a checkpoint, nor the seeded init: then the peers stand still, or restart, at ``start``).
        ``resume_step`` just decided where ``start`` came from (``resume_from``)."""
        if self.resume_from != "live" or start == 0:
            return start
        cfg = self.host.cfg
        lead_s = cfg.handoff_lead_s + 2 * cfg.poll_interval_s
        step_s = typical_step_s(self.progress.latest.values())
        h = self.plan.under(self.host.job).compression.sync_every if self.plan is not None else 1
        moved, why = handoff_step(start, step_s, lead_s, self.host.job.steps, h)
        logger.info("%s", why)
        return moved

    def _settle(self, now: float) -> bool:
        """True while a re-plan may still wait for live peers' reports (``RESUME_SETTLE_S``)."""
        self._settle_since = self._settle_since if self._settle_since is not None else now
        return now - self._settle_since < RESUME_SETTLE_S

    async def replan(
        self,
        why: str,
        failed: bool = False,
        handoff: bool = False,
        candidate: tuple[TrainPlan, PlacementPlan] | None = None,
    ) -> None:
        """Plan (or re-plan) and publish. ``handoff``: nobody failed (a graceful leave, placing a
        joiner): leaving peers still hold their state, and the plan starts a few steps ahead so the old
        plan's peers stop there together. ``candidate``: a plan already searched (``tend_joiners``)."""
        host, job = self.host, self
        if self._links_pending():
            host.last_reason = "enough peers; waiting briefly for their link measurements"
            return
        epoch = host.first_epoch if job.plan is None else job.plan.epoch + 1
        gone_before: list[str] = []  # found gone by this coordinator before the survivors' reports came
        if failed and job.plan is not None:
            gone_before = await self._await_survivors(job.plan)
        speeds = job.measured_speeds()
        now = get_dht_time()
        # Suspects that did not heartbeat since a peer failed to reach them sit this plan out.
        _, excluded = job.progress.verdicts(host.state, now, job.retry)
        excluded = sorted({*excluded, *gone_before} & set(host.state.peers))
        state = host.state.without(excluded)
        live = set(state.peers) | (set(host.state.leaving) if handoff else set())  # leavers still hold it
        start = self.resume_step(live)
        held = max((h.step for p, h in job.progress.holdings.items() if p in live), default=0)
        if start < held and self._settle(time.monotonic()):
            # Live peers hold newer state than any step every layer is known at: their exact reports
            # (a failed run says what it holds) are on their way. Restarting from an older checkpoint,
            # or the seeded init, would throw their training away (run O restarted from step 0 a swarm
            # that had trained to step 977), so wait for them, a few seconds at most.
            host.last_reason = f"waiting up to {RESUME_SETTLE_S:.0f} s for live peers' reports of step {held}"
            return
        self._settle_since = None
        if handoff:
            start = self._handoff_start(start)
        plan: TrainPlan | None
        placement: PlacementPlan | None
        if candidate is not None and not set(candidate[0].peers) <= set(state.peers):
            # searched before a suspicion excluded one of its peers (run N: a dead peer placed by such a
            # plan made the next re-plan find no live holder and restart from step 0): search again
            candidate = None
        if candidate is not None:
            found, placement = candidate
            plan = found.model_copy(update={"epoch": epoch, "start_step": start, "issued_at": now})
            reason = "a fresh plan with the newcomers"
        else:
            plan, placement, reason = await asyncio.to_thread(
                make_train_plan,
                state,
                host.job,
                now,
                epoch,
                start,
                job.placement,
                None,
                speeds,
                frozenset(job.speeds.distrusted),
                job.ratios.update(job.plan, host.job, job.progress.latest.values()),
                # a bottleneck job's positions, fixed by earlier plans: a moved cut keeps its maps
                job.plan.bottleneck_cuts if job.plan is not None else None,
                running=job.plan is not None,  # below min_peers a running job goes on if they hold it
                keep_compression=job.plan.compression if job.plan is not None else None,
            )
        if plan is None:
            if reason != host.last_reason:
                logger.info("not planning yet: %s", reason)
            host.last_reason = reason
            await self._say_waiting(live, reason)
            return
        # where peers look first, whom they ask, and whether the start is knowingly behind
        holders = start_holders(start, live, job.progress.holdings, job.progress.also_holdings)
        behind = held if held > start and self.resume_from == "live" and start > 0 else None
        plan = plan.model_copy(update={"resume_from": self.resume_from, "holders": holders, "behind": behind})
        if excluded:
            left_out = "suspected: unreachable, and no heartbeat since"
            spares = plan.spares + [Spare(peer_id=p, reason=left_out) for p in excluded]
            plan = plan.model_copy(update={"spares": spares})
            reason = f"{reason}; left out {len(excluded)} suspect(s)"
        job.placement = placement
        job.progress.new_epoch(failed)
        await job.publish(plan)
        job.joins.new_plan(plan)
        host.last_reason = f"{why} -> {reason}"
        logger.info("published plan epoch %d from step %d: %s", epoch, start, host.last_reason)
        job.published(plan, host.last_reason)

    async def _say_waiting(self, live: set[str], reason: str) -> None:
        """A running plan lost peers and no new one can run yet: re-publish the SAME epoch naming its
        gone peers and why it waits (``TrainPlan.gone``, ``.waiting``), so the survivors stop dialling
        the dead at once and every view says what the job waits for, until a plan can run again."""
        plan = self.plan
        if plan is None or plan.status != "training":
            return
        gone = sorted(p for p in plan.peers if p not in live)
        waiting = reason[:128]
        if not gone or (gone == plan.gone and waiting == plan.waiting):
            return
        plan = plan.model_copy(update={"gone": gone, "waiting": waiting, "issued_at": get_dht_time()})
        await self.publish(plan)
        logger.info(
            "plan epoch %d waits: %s (gone: %s)", plan.epoch, waiting, ", ".join(p[:12] for p in gone)
        )
        self.published(plan, f"waiting: {waiting}")

    async def tend_joiners(self) -> None:
        """Name the peers the plan does not place as spares, with why, by re-publishing the SAME epoch
        (placed peers act only on a higher one; a newcomer takes it and reports "waiting"); at most every
        ``join_check_s``, price placing them (a planner search, off the loop) and re-plan when it pays."""
        host, job = self.host, self
        plan = job.plan
        if plan is None or plan.status != "training":
            return
        step = job.progress.step(plan)
        spares = job.joins.spares(plan, host.state, host.job, step)
        if spares != plan.spares:
            plan = plan.model_copy(update={"spares": spares, "issued_at": get_dht_time()})
            await job.publish(plan)
            told = "; ".join(f"{s.peer_id[:12]}: {s.reason}" for s in spares if s not in job.joins.base)
            logger.info("plan epoch %d re-published with its spares: %s", plan.epoch, told or "none")
            job.published(plan, f"spares of epoch {plan.epoch} updated")
        if step <= plan.start_step:
            # Not before every placed peer committed a step of this plan: a hand-off now races the
            # plan's own start (churn run M: after most kills the repair was followed within a second
            # by a plan placing the kill's replacement from a step the repair never reached, which
            # failed, and a third plan went back to the repair's start: 2-3 s lost per kill).
            return
        newcomers = job.joins.newcomers(plan, host.state, host.job)
        if not job.joins.due(newcomers, time.monotonic()):
            return
        # priced on the swarm a re-plan would use: a dead peer still heartbeating in the DHT, excluded
        # as a suspect, would otherwise be placed by the candidate, which the re-plan then drops
        _, excluded = job.progress.verdicts(host.state, get_dht_time(), job.retry)
        decision, reason, ev = await asyncio.to_thread(
            job.joins.evaluate,
            host.state.without(excluded),
            host.job,
            plan,
            step,
            job.measured_speeds(),
            newcomers,
            get_dht_time(),
            time.monotonic(),
            typical_step_s(job.progress.latest.values(), default=0.0),  # 0: not measured yet
            job.ratios.update(job.plan, host.job, job.progress.latest.values()),
        )
        logger.info("newcomer(s) %s: %s", ", ".join(p[:12] for p in newcomers), reason)
        still = job.plan is not None and job.plan.epoch == plan.epoch  # no re-plan meanwhile
        if decision == "improve" and still and ev.plan is not None and ev.placement is not None:
            await job.read_progress()  # the swarm trained on during the search: start from where it is
            await self.replan(reason, handoff=True, candidate=(ev.plan, ev.placement))
