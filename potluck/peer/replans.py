"""The worker's answers to re-published and newer plans: train on to a newer plan's start step before
switching, stop exactly there, report a plan that starts behind what this peer committed, pause at a
re-published ``stop_at``, dial no peer the coordinator declared gone, and tell a spare its reason
(``peer/leave.py`` decides the switches).

A mixin of ``PlanWorker`` (``peer/worker.py``): the state it reads is the worker's, declared below.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from potluck.net.mailbox import Mailbox
from potluck.peer.activity import Activity
from potluck.peer.leave import switch_deadline, switch_verdict
from potluck.peer.train.trainer import StepReport, Trainer
from potluck.protocol.training import TrainPlan
from potluck.transfer.server import StateServer

logger = logging.getLogger(__name__)


class Replans:
    peer_id: str
    plan: TrainPlan | None
    _pending: TrainPlan | None
    _pending_until: float
    _last_report: StepReport | None
    _task: asyncio.Task[None] | None
    _running: Trainer | None
    state: StateServer | None
    activity: Activity
    box: Mailbox
    _publish: Callable[..., Coroutine[Any, Any, None]]  # PlanWorker._publish: a progress record

    def _train_on(self, plan: TrainPlan) -> bool:
        """True while the running run should train on toward ``plan``'s start step before switching."""
        running = self._task is not None and not self._task.done()
        last = self._last_report
        at = last.step + 1 if last is not None else None
        verdict, why = switch_verdict(plan.start_step, at, running and plan.status == "training")
        now = time.monotonic()
        if verdict == "switch" or at is None or last is None:
            self._pending = None
            return False
        if self._pending is None or self._pending.epoch != plan.epoch:
            self._pending = plan
            self._pending_until = switch_deadline(now, plan.start_step, at, last.seconds)
            logger.info("plan epoch %d from step %d: %s", plan.epoch, plan.start_step, why)
        if now > self._pending_until:
            logger.warning(
                "plan epoch %d: step %d not reached in time; switching", plan.epoch, plan.start_step
            )
            self._pending = None
            return False
        return True

    def _stop_at_handoff(self, r: StepReport) -> None:
        """Called after each committed step: stop the run exactly at a pending plan's start step (the
        next plan poll switches), so every peer of the old plan holds that step."""
        pending = self._pending
        if pending is not None and r.step + 1 >= pending.start_step and self._task is not None:
            logger.info("stopping at step %d for plan epoch %d", r.step + 1, pending.epoch)
            self._task.cancel()

    async def _overshot(self, plan: TrainPlan) -> bool:
        """A plan that starts behind the step this peer's run had committed came from stale reports.
        Commits are all-or-nothing, so no peer of the old plan holds that step any more: say so at
        once (a "failed" record with the held step, which the next plan starts from) instead of
        asking holders for it until the fetch gives up. False when this peer has nothing to say.

        A start from a checkpoint or from the seeded init is the coordinator's choice, not a stale
        report: some stage lost every live replica, so the step this peer holds is of no use (churn run
        V: a 2 x 1 plan whose stage 1 was killed started from step 0 four times, and each time its
        stage 0 peer failed the plan with this report first). So is a live start behind a step the
        coordinator knew of (``TrainPlan.behind``): that step lost some stage's every holder (run X:
        the peer holding step 816 of stage 0 failed three plans from step 736 this way)."""
        pos = plan.position(self.peer_id)
        held = self.state.offered if self.state is not None else None
        if pos is None or held is None or held.meta.job != plan.job or held.meta.step <= plan.start_step:
            return False
        if plan.resume_from != "live" or plan.start_step == 0:
            return False
        if plan.behind is not None and held.meta.step <= plan.behind:
            return False  # the coordinator knew of this step and that some stage's layers of it are lost
        why = f"this peer holds step {held.meta.step}, past the plan's start {plan.start_step}"
        logger.warning("plan epoch %d: %s; reporting it", plan.epoch, why)
        await self._publish(plan, pos[0], pos[1], held.meta.step, state="failed", message=why, force=True)
        return True

    def _note_stop(self, plan: TrainPlan) -> None:
        """The followed epoch re-published with a pause (``TrainPlan.stop_at``): the run stops after that
        step, with a checkpoint of it (docs/multijob.md, "Pauses")."""
        old = self.plan
        if old is None or plan.issued_at <= old.issued_at or plan.stop_at == old.stop_at:
            return
        self.plan = plan if old.position(self.peer_id) is not None else old  # spares: _note_spare's
        if self._running is not None and plan.stop_at is not None:
            logger.info("plan epoch %d pauses after step %d", plan.epoch, plan.stop_at)
            self._running.stop_step = plan.stop_at

    def _note_gone(self, plan: TrainPlan) -> None:
        """The followed epoch re-published with peers the coordinator declared gone and why it waits
        (``TrainPlan.gone``, ``.waiting``): dial them no more, and show the reason on this peer's line.
        Reads nothing else of the re-published plan (``_note_stop`` and ``_note_spare`` do)."""
        if plan.gone:
            self.box.declare_gone(plan.gone)
        if plan.waiting is not None and plan.waiting != self.activity.why:
            logger.warning("plan epoch %d waits: %s", plan.epoch, plan.waiting)
            self.activity.waiting(plan.waiting)

    def _spare_reason(self, plan: TrainPlan) -> str:
        return next((s.reason for s in plan.spares if s.peer_id == self.peer_id), "not placed by the plan")

    async def _note_spare(self, plan: TrainPlan) -> None:
        """The followed epoch re-published (fresh spares): a peer it does not place learns its reason.
        Placed peers ignore it, so re-publishing an epoch never disturbs training."""
        old = self.plan
        if old is None or plan.issued_at <= old.issued_at or old.position(self.peer_id) is not None:
            return
        if plan.position(self.peer_id) is not None or (self._task is not None and not self._task.done()):
            return
        self.plan = plan
        why = self._spare_reason(plan)
        self.activity.spared(plan.job, plan.epoch, why)
        if why != self._spare_reason(old):
            logger.warning("not placed in plan epoch %d: %s", plan.epoch, why)
            await self._publish(plan, 0, 0, plan.start_step, state="waiting", message=why, force=True)
