"""The peer's training side: follow the coordinator's signed plan, train its part, report progress.

Every ``plan_poll_s`` the worker reads the plan key. Only plans signed by the swarm's coordinator get
this far (the DHT validator and the reader both verify), and only a plan with a higher epoch than the
one being followed is acted on, so a replayed old plan changes nothing. A new epoch cancels the running
trainer and starts the new one from the plan's ``start_step`` (its checkpoint). Each completed step is
published as a signed ``Progress`` record, which is how the coordinator sees the job move, fail or end.

Live state (with an identity to sign manifests): when a training run ends (a new epoch, the job done, a
failure), the worker keeps a copy of its stage's state and serves it (``peer/state/transfer.py``). A new
run starting after step 0 takes its state from this copy, its own checkpoints, or the previous plan's
peers over the swarm, in that order; each must be exactly the plan's ``start_step``.

Any error that ends training, expected or not (a lost neighbour, a KeyError, CUDA out of memory), is
published as a "failed" record that names it, so the coordinator re-plans at once instead of the other
peers waiting out their step timeout; an unexpected one is also logged with its traceback. The
training run and the progress records in flight are tasks of one ``aio.Supervisor``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from hivemind.utils import get_dht_time

from potluck.aio import Supervisor
from potluck.compression.kernels import native
from potluck.model.data import TokenDataset, load_dataset
from potluck.net.admit import admitted
from potluck.net.config import TransportConfig
from potluck.net.dial import dht_addresses
from potluck.net.faults import read_faults
from potluck.net.mailbox import Mailbox
from potluck.net.node import SwarmNode
from potluck.net.streams import Streams
from potluck.net.tags import before
from potluck.peer import priority
from potluck.peer.activity import Activity
from potluck.peer.config import WorkerConfig
from potluck.peer.data.feed import Feeds
from potluck.peer.data.paths import local_data
from potluck.peer.errors import PeerError
from potluck.peer.follow import LeaseFollower
from potluck.peer.lease import describe
from potluck.peer.leave import LeaveView, leave_verdict
from potluck.peer.replans import Replans
from potluck.peer.state.copies import CopyDuty
from potluck.peer.state.holdings import Holdings
from potluck.peer.state.source import StateSource
from potluck.peer.state.sources import start_sources
from potluck.peer.train.budget import WaitBudget
from potluck.peer.train.trainer import StepReport, Trainer
from potluck.protocol.envelope import Verified
from potluck.protocol.errors import ProtocolError
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.keys import JobKeys
from potluck.protocol.training import Progress, ProgressState, StepTiming, TrainPlan, Witness
from potluck.transfer.errors import StateError
from potluck.transfer.server import StateServer, TransferConfig

logger = logging.getLogger(__name__)

RECENT_PLANS = 3  # plans whose peers are asked for state: a failed plan or two may sit in between
REASON_CHARS = 128  # a failure's reason as published (Progress.message holds at most 128 characters)
# Failures a run can meet in normal operation (a lost neighbour, no state to be had, a bad record):
# reported without a traceback.
EXPECTED = (PeerError, StateError, ProtocolError, OSError, ValueError)
VOUCH_EVERY_S = 1.0  # at most one DHT read a second about senders outside the plan
CANCEL_GRACE_S = 5.0  # seconds a cancelled training run may spend unwinding before it is left behind


class PlanWorker(Replans):
    # A newer plan that starts ahead of this peer's running step: trained toward, then switched to
    # (peer/leave.py), no later than the monotonic time in _pending_until.
    _pending: TrainPlan | None = None
    _pending_until = 0.0

    def __init__(
        self,
        node: SwarmNode,
        peer_id: str,
        swarm_id: str,
        cfg: WorkerConfig,
        identity: Identity | None = None,
        owner: str | None = None,
        cotenant: bool = False,
        uplink: Callable[[], float | None] | None = None,
    ) -> None:
        """``owner``: the coordinator's peer id; it keeps the job owner's checkpoint copy and serves it.
        ``cotenant``: this peer is a shared device's second peer; it trains only what a lease names.
        ``uplink()``: this peer's uplink in bytes/s as last measured or declared (None: unknown); while
        it trains, the state it serves takes at most a share of it (``transfer/pace.py``)."""
        self.node, self.peer_id, self.cfg, self.swarm_id = node, peer_id, cfg, swarm_id
        self.faults = read_faults()  # injected by a test or benchmark (net/faults.py); none here
        self.lease = LeaseFollower(node, peer_id, cotenant)  # the job followed on a swarm of several jobs
        self.owner = owner
        self.identity = identity  # signs state manifests and (spot-checked jobs) pipeline messages
        self.box = Mailbox(
            node.p2p,
            f"potluck/{swarm_id}/train/1",
            TransportConfig(timeout_s=cfg.step_timeout_s),
            addresses=dht_addresses(node),  # dial peers at the addresses their heartbeats announce
            vouch=self._in_newer_plan,
            drop=self.faults.dropped(),
        )
        self._vouched: frozenset[str] = frozenset()  # peers of the newest plan read by _in_newer_plan
        self._vouched_at = -VOUCH_EVERY_S
        self._vouching = asyncio.Lock()
        self.plan: TrainPlan | None = None
        self._recent: list[TrainPlan] = []  # the plans before this one, newest last
        self._tasks: Supervisor | None = None  # set while run() runs
        self._task: asyncio.Task[None] | None = None  # the training run of the current plan
        self._datasets: dict[str, TokenDataset] = {}
        self._budgets: dict[str, WaitBudget] = {}  # job -> its measured step times (train.budget)
        self._last_progress = 0.0
        self._tokens_per_s = 0.0
        self.steps_done = 0  # steps this worker completed (all plans)
        self._sending: set[asyncio.Task[None]] = set()  # progress records in flight
        self._last_report: StepReport | None = None  # the newest step under the current plan
        self._checkpoint: int | None = None  # the newest checkpoint this peer wrote
        self._last_record: Progress | None = None  # the newest progress record it published
        self.activity = Activity()  # what it does and did, for the volunteer and the telemetry
        self._running: Trainer | None = None  # the trainer of the current run
        # Serving and fetching live state needs the key that signs manifests; without one, disk only.
        self._uplink = uplink
        # an outer sync under the next steps fills the pipeline's gaps, at most at the serving share of
        # the uplink (net/pace.py)
        self.box.background.uplink, self.box.background.share = self._training_uplink, cfg.serve_share
        self.streams = Streams(node.p2p)
        self.streams.credentials = lambda: node.admission  # shown to the peers it fetches state from
        self.transfer = TransferConfig(serve_share=cfg.serve_share)
        self.state: StateServer | None = None
        if identity is not None:
            self.state = StateServer(
                self.streams, swarm_id, identity, self.transfer, self._may_fetch, self._training_uplink
            )
        self.copies = CopyDuty(self.streams, swarm_id, peer_id, self.transfer, on_copied=self._copy_landed)
        self.holdings = Holdings(self.state)  # what it holds, as its progress records say (state/holdings.py)
        rate = lambda: (u * cfg.serve_share) if (u := self._training_uplink()) else None  # noqa: E731
        self.feeds = Feeds(
            self.streams, swarm_id, cfg.state_dir / "corpora", self._data_holders, self._may_fetch, rate
        )
        self._pushed: TrainPlan | None = None  # the newest plan the coordinator pushed (net/push.py)
        self._woken = asyncio.Event()  # set by a push: read the plan now, not at the next poll

    def _training_uplink(self) -> float | None:
        """This peer's uplink (bytes/s) while its trainer steps, for the state server's pace; else None
        (before the first step and after the last, serving is what the swarm waits on)."""
        run = self._running
        return self._uplink() if self._uplink is not None and run is not None and run.stepping else None

    async def run(self) -> None:
        """Follow the plan until cancelled; cancelling ends the training run and the records in flight."""
        # the native codec kernels build once per machine (~5 s of cc): off the loop, before any step
        await asyncio.to_thread(native.lib)
        await self.box.start()
        if self.state is not None:
            await self.state.start()
        await self.feeds.start()
        await self.node.take_pushes(self._pushed_names, self._take_pushed)
        try:
            async with Supervisor(CANCEL_GRACE_S) as tasks:
                self._tasks = tasks
                while True:
                    try:
                        await self._poll()
                    except Exception:  # a failed read is retried at the next poll
                        logger.exception("reading the plan failed")
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._woken.wait(), self.cfg.plan_poll_s)
                    self._woken.clear()
        finally:
            self._tasks = self._task = None
            await self.node.stop_pushes()
            await self.copies.close()
            await self.box.close()
            await self.feeds.close()
            if self.state is not None:
                await self.state.close()

    def _pushed_names(self) -> list[str]:
        keys = self.lease.keys
        return [keys.plan] if keys is not None else []

    async def _take_pushed(self, v: Verified) -> None:
        """A plan the coordinator pushed (of this job's plan key: ``_pushed_names``), verified as a DHT
        read is: follow it at once."""
        if not isinstance(v.record, TrainPlan):
            return
        if self._pushed is None or v.record.issued_at > self._pushed.issued_at:
            self._pushed = v.record
            self._woken.set()

    async def _poll(self) -> None:
        target = await self.lease.target()
        if target == self.lease.keys:
            self.lease.moving = None  # a lease that moved back: nothing to hand over
        elif await self._may_move(target):
            await self._move_to(target)
        if (keys := self.lease.keys) is None:
            return
        pushed, self._pushed = self._pushed, None
        if pushed is not None and (self.plan is None or pushed.epoch > self.plan.epoch):
            plans = [pushed]  # a new epoch, pushed: no DHT read to wait for
        else:
            plans = [v.record for v in await self.node.fetch(keys.plan) if isinstance(v.record, TrainPlan)]
            plans += [pushed] if pushed is not None else []  # a re-published epoch (gone, stop_at, spares)
        if not plans:
            return
        plan = max(plans, key=lambda p: (p.epoch, p.issued_at))
        if self.plan is not None and plan.epoch <= self.plan.epoch:
            if plan.epoch == self.plan.epoch:
                self._note_gone(plan)
                self._note_stop(plan)
                await self._note_spare(plan)
            return
        at = self._last_report.step + 1 if self._last_report is not None else None  # before the switch
        if self._train_on(plan):
            return
        await self._cancel()
        if self.plan is not None:  # the plans whose peers may hold state this run can start from
            self._recent = [*self._recent, self.plan][-RECENT_PLANS:]
        self.plan, self._last_report = plan, None
        await self.box.admit(plan.peers)  # only this plan's peers may send to this peer
        self.box.advance(plan.epoch, plan.start_step)
        await self.box.forget(before(plan.epoch))  # stale messages of older epochs
        self.box.take_suspects()  # and suspicions raised under them
        logger.info("plan epoch %d (%s) from step %d", plan.epoch, plan.status, plan.start_step)
        if plan.status == "done" or (at is not None and at > plan.start_step and await self._overshot(plan)):
            return
        if await self._stopped_there(plan):
            return
        assert self._tasks is not None
        self._task = self._tasks.start(f"train-epoch-{plan.epoch}", self._train(plan, list(self._recent)))

    async def _stopped_there(self, plan: TrainPlan) -> bool:
        """Whether this peer already stopped at ``plan``'s pause (``TrainPlan.stop_at``) and must not
        start the epoch again: a peer that paused with its checkpoint, served another job's lease and
        came back reads the paused epoch before the one that resumes it, and starting it would run the
        epoch from its first step up to the pause once more (minutes of work thrown away). A placed
        peer that holds nothing at the pause (it restarted on the way there) still runs up to it."""
        pos = plan.position(self.peer_id)
        if plan.stop_at is None or pos is None:
            return False
        root = self.cfg.checkpoints(plan.job, self.lease.keys_of(plan.job).home)
        await asyncio.to_thread(self.holdings.look_at_disk, root)  # what its reports claim, too
        if not self.holdings.stores(plan.stop_at, plan.stages[pos[0]]):
            return False
        await self._report_paused(plan, pos[0], pos[1], plan.stop_at)
        return True

    async def _report_paused(self, plan: TrainPlan, stage: int, replica: int, step: int) -> None:
        """Say that this peer stopped at ``plan``'s pause after ``step`` steps, its checkpoint kept."""
        why = f"paused at step {step}: the job waits for its lease (checkpoint kept)"
        await self._publish(plan, stage, replica, step, state="waiting", message=why, force=True)
        self.activity.spared(plan.job, plan.epoch, why)
        logger.info("plan epoch %d: %s", plan.epoch, why)

    def _may_fetch(self, peer: str, admission: bytes | None) -> bool:
        """Whether ``peer`` may fetch this peer's state: admitted (or the coordinator), not banned."""
        return admitted(self.node.policy, peer, admission, get_dht_time())

    async def _in_newer_plan(self, peer: str) -> bool:
        """Whether ``peer``, which is not in this peer's plan, is in a newer plan this peer has not read
        yet (its first messages can come before our next poll). Reads the DHT at most once a second,
        whoever asks: a stranger's streams cannot make this peer hammer the DHT."""
        async with self._vouching:
            if time.monotonic() - self._vouched_at >= VOUCH_EVERY_S:
                self._vouched_at = time.monotonic()
                epoch = self.plan.epoch if self.plan is not None else -1
                keys = self.lease.keys
                found = [
                    v.record
                    for v in (await self.node.fetch(keys.plan) if keys is not None else [])
                    if isinstance(v.record, TrainPlan)
                ]
                self._vouched = frozenset().union(*(p.peers for p in found if p.epoch > epoch))
        return peer in self._vouched

    async def _cancel(self) -> None:
        if self._task is not None and self._tasks is not None:
            await self._tasks.cancel(self._task)
        self._task = None

    # ---- several jobs on one swarm: follow the lease (peer/follow.py, peer/lease.py) -----------------

    async def _may_move(self, target: JobKeys | None) -> bool:
        """Whether to follow ``target`` now: once the job followed no longer needs this peer (its next
        plan is under way without it), as a leaving peer decides (``leave.leave_verdict``)."""
        now = time.monotonic()
        plan = self.newest_plan()
        placed = plan is not None and plan.status == "training" and plan.position(self.peer_id) is not None
        move = self.lease.asked(target, now, placed or self.running())
        if self.lease.keys is None or plan is None:
            return True
        running = self.running()
        under_way = not placed and not running and await self.under_way(plan)
        done = plan.status == "done" or (plan.stop_at is not None and not running)  # ended, or paused
        view = LeaveView(move.since, move.placed_at_start, placed, running, under_way, done, 1)
        decision, why = leave_verdict(view, now, self.cfg.move_timeout_s)
        if decision == "go":
            logger.info("moving to %s: %s", describe(target), why)
        return decision == "go"

    async def _move_to(self, target: JobKeys | None) -> None:
        """Follow ``target``'s plans from now on (its epochs are its own: start afresh)."""
        await self._cancel()
        self.lease.moved(target)
        self._pending, self.plan, self._recent, self._last_report = None, None, [], None
        await self.box.forget(before((1 << 27) - 1))  # every message of the job left
        if target is None:
            self.activity.spared("", 0, "no lease this round")

    async def under_way(self, plan: TrainPlan) -> bool:
        return await self.lease.under_way(plan)

    async def _job(self, plan: TrainPlan) -> JobSpec:
        keys = self.lease.keys_of(plan.job)
        jobs = [v.record for v in await self.node.fetch(keys.job) if isinstance(v.record, JobSpec)]
        if not jobs or jobs[0].name != plan.job:
            raise PeerError(f"the swarm's job spec for {plan.job!r} is not readable yet")
        return plan.under(jobs[0])  # with the compression the coordinator chose, for compression = "auto"

    def _sources(self, plan: TrainPlan, recent: Sequence[TrainPlan], root: Path) -> list[StateSource]:
        if self.state is None:
            return []  # the trainer's own disk path, as before live state existed
        return start_sources(
            plan, recent, root, self.state, self.streams, self.swarm_id, self.peer_id, self.owner
        )

    async def _train(self, plan: TrainPlan, recent: Sequence[TrainPlan] = ()) -> None:
        pos = plan.position(self.peer_id)
        if pos is None:
            why = self._spare_reason(plan)
            logger.warning("not placed in plan epoch %d: %s", plan.epoch, why)  # a volunteer wants to know
            self.activity.spared(plan.job, plan.epoch, why)
            await self._publish(plan, 0, 0, plan.start_step, state="waiting", message=why, force=True)
            return
        stage, replica = pos
        a = plan.stages[stage]
        layers, waves = f"{a.first_layer}-{a.last_layer - 1}", len(plan.shards(stage, replica))
        self.activity.placed(plan.job, plan.epoch, stage, replica, plan.start_step, layers, waves)
        trainer: Trainer | None = None
        try:
            job = await self._job(plan)
            dataset, data_ready = await self._dataset(job)
            # this peer's own disk; the job's dir is the owner's
            root = self.cfg.checkpoints(job.name, self.lease.keys_of(job.name).home)
            if self.state is not None:
                self.state.serve_disk(job.name, root)  # its checkpoints, for peers that lost theirs
            self.holdings.look_at_disk(root)  # a restarted peer's disk still counts
            trainer = Trainer(
                self.box,
                job,
                plan,
                dataset,
                self.cfg.trainer(),
                root,
                sources=self._sources(plan, recent, root),
                budget=self._budget(job.name),
                identity=self.identity,
            )
            reads = trainer.runner.is_first or trainer.runner.is_last or trainer.runner.needs_tokens
            trainer.data_ready = data_ready if reads else None  # a middle stage reads no tokens
            trainer.audit.excluded = self.node.policy.banned  # live: the ban list as the daemon reads it
            if self.plan is not None and self.plan.epoch == plan.epoch:  # a pause may have come meanwhile
                trainer.stop_step = self.plan.stop_at
            run = self._running = trainer
            self.activity.gradient_ratio = trainer.gradient_ratio()
            await trainer.run(
                lambda r: self._on_step(plan, stage, replica, job, r, run.n_params, run.held_step),
                on_ready=lambda: self._took_state(plan, stage, replica),
            )
            await asyncio.gather(*self._sending, return_exceptions=True)  # "done" must be the newest record
            if trainer.step < job.steps:  # a pause (TrainPlan.stop_at): the job goes on later
                await self._report_paused(plan, stage, replica, trainer.step)
                return
            await self._publish(plan, stage, replica, trainer.step, state="done", force=True)
            self.activity.finished(trainer.step)
            logger.info("finished the job at step %d", trainer.step)
        except EXPECTED as e:  # the reason says it all
            logger.warning("training under plan epoch %d stopped: %s", plan.epoch, e)
            for holder in e.unreachable if isinstance(e, StateError) else ():
                self.box.suspect(holder)  # a state holder no stream reached: the coordinator probes it
            self.holdings.keep(trainer)  # before the record, which says what this peer holds
            step = self.holdings.reported_step(plan, trainer)
            self.activity.failed(step, str(e))
            await self._publish(
                plan, stage, replica, step, state="failed", message=str(e)[:REASON_CHARS], force=True
            )
        except Exception as e:  # a bug or the device (KeyError, CUDA out of memory): same record, + traceback
            logger.exception("training under plan epoch %d failed", plan.epoch)
            self.holdings.keep(trainer)
            step = self.holdings.reported_step(plan, trainer)
            self.activity.failed(step, failure_reason(e))
            await self._publish(
                plan, stage, replica, step, state="failed", message=failure_reason(e), force=True
            )
        finally:
            self.holdings.keep(trainer)
            if self._running is trainer:
                self._running = None

    async def _dataset(self, job: JobSpec) -> tuple[TokenDataset, Callable[[int], Awaitable[None]] | None]:
        """The job's token stream, and what to await before each step: a shipped corpus's shards for that
        step (peer/data/feed.py); else the data read from this machine's files, once, and nothing."""
        if job.data.fingerprint is not None:  # shipped; a copy under --data-dir is checked against it
            mirror = None
            if self.cfg.data_dir is not None:
                spec = job.data.model_copy(update={"source": "generated", "path": None})  # its tokenizer only
                tokenizer = local_data(spec, self.cfg.state_dir, None, self.cfg.tokenizer).tokenizer
                mirror = (self.cfg.data_dir, Path(tokenizer) if tokenizer is not None else None)
            feed = await self.feeds.open(job, job.sequences_per_step, mirror)
            return feed.dataset, feed.ready
        if job.name not in self._datasets:
            self._datasets[job.name], _ = await asyncio.to_thread(
                load_dataset,
                local_data(job.data, self.cfg.state_dir, self.cfg.data_dir, self.cfg.tokenizer),
                job.model.seq_len,
                job.model.vocab_size,
                job.seed,
            )
        return self._datasets[job.name], None

    def _data_holders(self) -> list[str]:
        """Who may have a shard: the other peers of the newest plan (they read the same), then the owner."""
        plan = self.newest_plan()
        peers = sorted(p for p in (plan.peers if plan is not None else ()) if p != self.peer_id)
        return peers + ([self.owner] if self.owner is not None else [])

    def _budget(self, job: str) -> WaitBudget:
        """This peer's measured step times for ``job``, kept across plans: a new plan's waits start from
        them (the factor and floor absorb a changed layer split) rather than from the cap."""
        cfg = self.cfg.trainer()
        if job not in self._budgets:
            self._budgets[job] = WaitBudget(cfg.step_timeout_s, cfg.timeout_floor_s, cfg.timeout_factor)
        return self._budgets[job]

    async def _took_state(self, plan: TrainPlan, stage: int, replica: int) -> None:
        """This peer now holds its stage of ``plan`` at the plan's start: say so at once. Until its first
        step commits, the coordinator would otherwise still count the layers it held before (a moved
        peer), and a death in the first step could look like the loss of a whole stage."""
        self.holdings.at(plan.start_step, plan.stages[stage])
        priority.restore()  # its start-up is over (imports, probe, state): it trains at full priority
        trainer = self._running
        if trainer is not None and trainer.took is not None:
            self.activity.took_state(*trainer.took, step=plan.start_step)
        if self.state is not None and trainer is not None:
            # Served while it runs: if this run's pipeline breaks, the next plan's peers may need these
            # layers before this peer notices (it may be waiting on a dead neighbour for a step timeout).
            self.state.offer_live(trainer.snapshot)
        publish = self._publish(plan, stage, replica, plan.start_step, force=True)  # not holding step 1 up
        self._send_later(f"progress-ready-{plan.epoch}", publish)

    def _on_step(
        self, plan: TrainPlan, stage: int, replica: int, job: JobSpec, r: StepReport, n_params: int, held: int
    ) -> None:
        """After each committed step: count it, note checkpoints, and report. ``held``: the step of the
        state the run serves (``Trainer.held_step``: with DiLoCo, its last outer sync)."""
        self.steps_done += 1
        # its replica's share passes its stage (two shares for a peer running two waves)
        tokens = job.batch.tokens_per_step * len(plan.shards(stage, replica)) // plan.data_replicas
        self.activity.committed(r.step, tokens, 6.0 * n_params * tokens)
        self.activity.activation_ratio = r.activation_ratio
        tps = job.batch.tokens_per_step / max(r.seconds, 1e-9)
        self._tokens_per_s = tps if self._tokens_per_s == 0 else 0.7 * self._tokens_per_s + 0.3 * tps
        force = r.checkpoint is not None or r.step + 1 >= job.steps
        if r.checkpoint is not None:
            self._checkpoint = r.step + 1
            self.holdings.look_at_disk(r.checkpoint.parent)
            self.copies.after_checkpoint(job, plan, r.step + 1, r.checkpoint.parent)
        self._last_report = r
        self.holdings.at(held, plan.stages[stage])
        if self.faults.kill_at_step is not None and r.step + 1 >= self.faults.kill_at_step:
            logger.warning("committed step %d: killing this process (an injected fault)", r.step + 1)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)
        self._stop_at_handoff(r)
        self._send_later(
            f"progress-{r.step + 1}", self._publish(plan, stage, replica, r.step + 1, force=force)
        )

    def _send_later(self, name: str, publish: Coroutine[Any, Any, None]) -> None:
        """Publish off the training path; "done" waits for these (``_sending``) so it stays the newest."""
        assert self._tasks is not None
        task = self._tasks.start(name, publish)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _publish(
        self,
        plan: TrainPlan,
        stage: int,
        replica: int,
        step: int,
        *,
        state: ProgressState = "training",
        message: str = "",
        force: bool = False,
    ) -> None:
        """Publish this peer's state; the last step's loss, timing and bytes and the newest checkpoint
        ride along on every record, so the final "done" record still carries them."""
        now = time.monotonic()
        if not force and now - self._last_progress < self.cfg.progress_interval_s:
            return
        self._last_progress = now
        last = self._last_report if self._last_report is not None and self.plan is plan else None
        record = Progress(
            peer_id=self.peer_id,
            job=plan.job,
            epoch=plan.epoch,
            stage=stage,
            replica=replica,
            step=step,
            loss=None if last is None else max(0.0, min(last.loss, 1e6)),
            activation_ratio=last.activation_ratio
            if last is not None and last.activation_ratio > 0
            else None,
            tokens_per_s=self._tokens_per_s,
            timing=last.timing if last else StepTiming(),
            bytes_sent_per_step=last.bytes_sent if last else 0,
            checkpoint_step=self._checkpoint,
            state=state,
            message=message,
            suspects=self.box.take_suspects() if state == "failed" else [],  # the coordinator checks them
            holds=self.holdings.reported(),
            stored=self.holdings.stored,
            also_holds=self.holdings.also_held(),
            witnessed=self._witnessed(plan),
            issued_at=get_dht_time(),
        )
        self._last_record = record
        await self._put(record)

    def _witnessed(self, plan: TrainPlan) -> list[Witness]:
        """The running trainer's audit of the other replicas' contributions (this plan's run only)."""
        run = self._running
        if run is None or run.plan is not plan:
            return []
        return run.audit.witnesses(self.peer_id)

    async def _put(self, record: Progress) -> None:
        try:
            key = self.lease.keys_of(record.job).progress
            await self.node.publish(key, record, self.cfg.progress_ttl_s, self.peer_id)
        except Exception:  # progress is best effort; training goes on
            logger.exception("progress record for step %d not published", record.step)

    def _copy_landed(self, root: Path) -> None:
        """A checkpoint copy was written under ``root``: say so now (the newest record again, with the
        copy), not with the next step's record. The copy exists for the moment its stage's only replica
        dies, and the coordinator can resume from it only once it knows."""
        self.holdings.look_at_disk(root)
        last = self._last_record
        if last is None or self._tasks is None:
            return
        record = last.model_copy(update={"stored": self.holdings.stored, "issued_at": get_dht_time()})
        self._last_record = record
        self._send_later(f"progress-copy-{record.step}", self._put(record))

    def newest_plan(self) -> TrainPlan | None:
        """The plan this peer follows, or the newer one it trains on toward."""
        return self._pending or self.plan

    @property
    def last_report(self) -> StepReport | None:
        """The newest step this peer committed under the plan it follows."""
        return self._last_report

    @property
    def tokens_per_s(self) -> float:
        """The swarm's tokens per second over this peer's recent steps (smoothed)."""
        return self._tokens_per_s

    def running(self) -> bool:
        return self._task is not None and not self._task.done()


def failure_reason(error: BaseException) -> str:
    """``Type: message`` of an error, cut to what a Progress record carries."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return text[:REASON_CHARS]
