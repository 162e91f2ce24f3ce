"""A peer's part of a training job under one signed plan: its stage, its data shard, its steps.

Step s on stage j, replica i:
1. the 1F1B pipeline over this replica's micro-batches of global step s (``pipeline.py``);
2. the stage's replicas sum their gradients with the tree all-reduce, bucket by bucket, each bucket
   starting while the backward is still producing the earlier layers' gradients (``overlap.py``;
   skipped with DiLoCo local steps); with ``sync.policy = "deadline"``, one relaxed all-reduce of the
   whole gradient over the replicas ready by the deadline instead (``straggle.py``);
3. the step commit (``commit.py``) agrees on the global gradient norm and the loss, or aborts; the
   committed decision draws the step's pipeline spot checks (``spot.py``, sealed messages ``peer/seal``);
4. AdamW at the scheduled learning rate, clipped by the global norm; every H steps with DiLoCo, the
   outer sync; every ``checkpoint.interval`` steps each replica writes the stage's checkpoint to its own disk.

Messages of step s under plan epoch e carry the round ``Round(e, s, phase)`` (``net/tags.py``), so
messages of an aborted attempt under an older plan can never be mistaken for the current one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from potluck.compression import get_codec
from potluck.model.checkpoint import prune, save_stage, step_dir
from potluck.model.data import TokenDataset
from potluck.model.optim import clip_coefficient, learning_rate
from potluck.model.resume import load_layers
from potluck.model.stage import StageRunner
from potluck.net.faults import read_faults
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Phase, Round, before
from potluck.peer.collectives.diloco import DiLoCo
from potluck.peer.collectives.robust import Audit
from potluck.peer.collectives.tree import tree_allreduce
from potluck.peer.config import AllReduceConfig, TrainerConfig
from potluck.peer.errors import (
    CollectiveError,
    LateError,
    NeighbourError,
    PeerError,
    PipelineError,
    StepAborted,
)
from potluck.peer.state.source import StateSource, fetch_first
from potluck.peer.train.barrier import start_barrier
from potluck.peer.train.budget import WaitBudget
from potluck.peer.train.checks.audit import ShardAudits
from potluck.peer.train.checks.duties import Duties, Place, make_ledger
from potluck.peer.train.checks.recheck import GradientChecks
from potluck.peer.train.checks.spot import SpotChecks
from potluck.peer.train.commit import Decision, Decisions, Ready, commit_step
from potluck.peer.train.local import BACKGROUND_CHUNK_ELEMENTS, SETTLE_S, LocalSteps
from potluck.peer.train.outer import make_diloco, outer_mean, stage_gather
from potluck.peer.train.pipeline import MicroBatch, Neighbours, Timing, link_codecs, pipeline_step
from potluck.peer.train.replicas import ReplicaSync
from potluck.peer.train.straggle import WINDOW, deadline_s
from potluck.peer.train.waves import Waves
from potluck.protocol.checkpoints import StageMeta, plan_stage_meta
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import StepTiming, TrainPlan
from potluck.transfer.manifest import StateWant
from potluck.transfer.snapshot import StageState

logger = logging.getLogger(__name__)

STATE_FETCH_TIMEOUT_S = 600.0  # a whole stage's state from its sources: 1 GB at 2 MB/s


@dataclass(frozen=True)
class StepReport:
    step: int  # the step just completed (0-based); step + 1 steps are done
    loss: float
    lr: float
    seconds: float
    timing: StepTiming
    bytes_sent: int
    checkpoint: Path | None
    activation_ratio: float = 0.0  # fp32 bytes / coded bytes of the activations (and grads) it sent


class Trainer:
    def __init__(
        self,
        box: Mailbox,
        job: JobSpec,
        plan: TrainPlan,
        dataset: TokenDataset,
        cfg: TrainerConfig,
        checkpoint_root: Path,
        sources: Sequence[StateSource] = (),
        budget: WaitBudget | None = None,
        identity: Identity | None = None,
    ) -> None:
        """``sources``: where a plan starting after step 0 gets its state, in order (none: the checkpoint).
        ``budget``: the step times this peer measured under earlier plans of the job (a new plan's first
        steps then need not wait the full ``step_timeout_s``); it goes on measuring. ``identity``: this
        peer's key, which seals its pipeline messages when the job spot-checks them."""
        pos = plan.position(box.peer_id)
        if pos is None:
            raise ValueError(f"peer {box.peer_id} is not placed by plan epoch {plan.epoch}")
        self.box, self.job, self.plan, self.dataset, self.cfg = box, job, plan, dataset, cfg
        self.stage, self.replica = pos
        self.assignment = plan.stages[self.stage]
        n = len(plan.stages)
        self.where = Neighbours(
            self.stage,
            n,
            plan.stages[self.stage - 1].peers[self.replica] if self.stage > 0 else None,
            plan.stages[self.stage + 1].peers[self.replica] if self.stage + 1 < n else None,
        )
        self.runner = StageRunner(
            job.model,
            self.assignment.first_layer,
            self.assignment.last_layer,
            job.seed,
            job.optimizer,
            torch.device(cfg.device),
            cfg.precision,
            plan.bottleneck_cuts,  # the job's bottleneck positions, wherever this plan cuts
            unset=plan.start_step > 0 or job.model.pretrained,  # its state is loaded (_restore)
        )
        logger.info("stage %d runs on %s", self.stage, self.runner.device)
        self.checkpoint_root = checkpoint_root  # this peer's own disk, never the job's checkpoint.dir
        comp = job.compression
        self.act_codec = get_codec(comp.activations)
        # each pipeline link's codecs: the plan's per-link chains (TrainPlan.link_codecs), else the job's
        self.pipe_codecs = link_codecs(plan, self.stage, self.replica, comp.activations)
        self.grad_codec_spec = comp.gradients
        self._compute_s: deque[float] = deque(maxlen=WINDOW)  # recent compute s per step (deadline)
        self.audit = Audit()  # contributions this replica refused or found outlying, per peer
        self._slowdown_s = read_faults().delay_s(self.replica)  # injected by a test (net/faults.py)
        self.budget = budget or WaitBudget(cfg.step_timeout_s, cfg.timeout_floor_s, cfg.timeout_factor)
        # Trust duties (docs/security.md): sealed messages kept in a ledger, then the replica sync (which
        # seals into it for audits), then the checks that need both (checks/duties.py)
        ledger = make_ledger(job, plan, self.stage, identity, box.peer_id)
        self.decisions = Decisions(box, plan, identity)  # the leader signs them; peers relay them
        self.replicas = ReplicaSync.build(
            self.runner, box, job, plan, self.stage, cfg, self._allreduce_cfg, self.audit, ledger
        )
        self.schedule = self.replicas.schedule
        self.sync, self.deadline = self.replicas.bucket, self.replicas.deadline
        self.lateness = self.replicas.lateness
        at = Place(
            self.runner,
            box,
            job,
            plan,
            self.stage,
            self.replica,
            self.schedule,
            self.audit,
            self.act_codec,
            self._allreduce_cfg(average=False),
            self.micro_batches,
            cfg.evidence_timeout_s,
        )
        self.duties = Duties.build(at, ledger, self.sync)
        self.ledger = ledger
        d = self.replicas.diloco  # with local steps; a new one each time the state is loaded
        self.local = LocalSteps(d, plan.start_step, box.background) if d is not None else None
        # Two replicas' shares on this device (StageAssignment.waves): tick-tock waves (train/waves.py)
        self.shards = plan.shards(self.stage, self.replica)  # the data shards this peer trains on
        self.waves: Waves | None = None
        if len(self.shards) == 2:
            if self.diloco is not None or self.deadline is not None or self.ledger is not None:
                raise ValueError("two waves need synchronous steps without local steps, deadlines or checks")
            self.waves = Waves(self.runner, cfg.max_memory_bytes)
        self.step = plan.start_step  # the next step to run
        # A paused job (TrainPlan.stop_at): the run ends after this step, with a checkpoint of it. The
        # worker may set it while the run is under way (the plan re-published with a pause).
        self.stop_step: int | None = plan.stop_at
        self.stepping = False  # inside the step loop: its traffic comes first (transfer/pace.py)
        self.sources = list(sources)
        self.took: tuple[str, float, int] | None = None  # (source, seconds, bytes) of the state it fetched
        self.n_params = sum(p.numel() for p in self.runner.params)
        self.data_ready: Callable[[int], Awaitable[object]] | None = None  # awaited before each step
        # True iff the runner holds exactly the state after self.step steps (loaded, and no step half-applied)
        self._consistent = False
        self._loaded = False  # the plan's start state is in the runner (a DiLoCo snapshot is of it)
        self._stepped = plan.start_step  # optimizer steps the runner's state has taken
        self._end = job.steps  # the step this run stops before (run: the job's end, a pause, ``until``)

    @property
    def diloco(self) -> DiLoCo | None:
        return self.local.diloco if self.local is not None else None

    @property
    def spot(self) -> SpotChecks | None:
        return self.duties.spot

    @property
    def audits(self) -> ShardAudits | None:
        return self.duties.audits

    @property
    def rechecks(self) -> GradientChecks | None:
        return self.duties.rechecks

    def restore(self) -> None:
        """Load the plan's starting checkpoint (past step 0, or a pretrained model's step 0)."""
        if self.plan.start_step == 0 and not self.job.model.pretrained:
            return
        root, step = self.checkpoint_root, self.plan.start_step
        first, last = self.assignment.first_layer, self.assignment.last_layer
        tensors = load_layers(root, step, first, last, self.job.model.n_layers)
        self.runner.load_state_tensors(tensors, take=True)  # read for this stage alone
        self._new_diloco()
        logger.info("stage %d resumed from %s", self.stage, step_dir(root, step))

    def _new_diloco(self) -> None:
        """With local steps, a DiLoCo on the loaded state (every replica's alike); its residual empty."""
        if self.local is not None:
            d = make_diloco(self.runner.params, self.job.compression, self.job.trust, self.step)
            self.local = LocalSteps(d, self.step, self.box.background)
            self._stepped = self.step

    def want(self) -> StateWant:
        """The state this stage starts from: its layers after the plan's ``start_step`` steps."""
        a, job = self.assignment, self.job
        return StateWant(job.name, job.model, job.seed, self.plan.start_step, a.first_layer, a.last_layer)

    async def _restore(self) -> None:
        # held state: past step 0, or a pretrained model's step 0 (its owner serves it); else the seeded init
        if self.sources and (self.plan.start_step > 0 or self.job.model.pretrained):
            t0 = time.perf_counter()
            fetched = await fetch_first(self.sources, self.want(), STATE_FETCH_TIMEOUT_S)
            nbytes = sum(t.numel() * t.element_size() for t in fetched.tensors.values())
            self.took = (fetched.source, time.perf_counter() - t0, nbytes)
            await asyncio.to_thread(self.runner.load_state_tensors, fetched.tensors, fetched.owned)
            self._new_diloco()
            logger.info("stage %d resumed at step %d from %s", self.stage, fetched.step, fetched.source)
        else:
            await asyncio.to_thread(self.restore)
        if self.waves is not None:  # its own memory profile, on the state it starts from
            await asyncio.to_thread(self.waves.prepare, self.micro_batches(self.step)[0])
        self._consistent = self._loaded = True

    def gradient_ratio(self) -> float:
        """fp32 bytes / coded bytes of one all-reduce chunk of this stage's gradients (0: no replicas).
        From the codec's payload size, not measured: the tree all-reduce re-encodes partial sums."""
        if self.plan.n_replicas == 1:
            return 0.0
        n = max(1, min(self.n_params, self.cfg.chunk_elements))
        return 4 * n / max(1, get_codec(self.grad_codec_spec).estimate_bytes((n,)))

    def stage_meta(self, step: int | None = None) -> StageMeta:
        """What this stage's state is after ``step`` steps (default ``self.step``; checkpoints and live
        snapshots)."""
        return plan_stage_meta(self.job, self.plan, self.stage, self.step if step is None else step)

    @property
    def held_step(self) -> int:
        """The step of the state this peer serves (``snapshot``) and its progress records claim: the
        last committed one, or with DiLoCo local steps the last outer sync (between syncs the replicas'
        weights differ, and a resume from one replica's would fork the stage)."""
        return self.local.synced_at if self.local is not None else self.step

    def snapshots(self) -> list[StageState]:
        """What a run that ended serves: ``snapshot``, and with local steps also the state of the sync
        before it, oldest first. When a replica dies inside an outer sync, the stages whose sync went
        through hold the new sync and the stage that lost it only the one before; that one is then the
        newest state every stage holds (churn run Z2 went back 500 steps without it)."""
        newest = self.snapshot()
        if newest is None or self.local is None or self.local.synced_before is None:
            return [newest] if newest is not None else []
        return [self._synced_state(previous=True), newest]

    def snapshot(self) -> StageState | None:
        """A copy of the state after ``held_step`` steps to serve to other peers, or None when there is
        none to trust (not loaded yet, or, without local steps, torn by a cancelled optimizer step).

        Between DiLoCo syncs that is the last sync's weights (DiLoCo's snapshot) with this replica's
        inner AdamW moments as they are now, their step counts set back to the sync's. The moments are
        each replica's own at a sync too (they never sync), so a resume from them is as good as one from
        a sync-step checkpoint, and keeping an exact copy of them at every sync would cost a second
        copy of the optimizer state in memory. Without this a kill between syncs left nobody able to
        serve the step the survivors reported, and the job failed (issue 38)."""
        if self.local is not None:
            return self._synced_state(previous=False) if self._loaded else None
        if not self._consistent:
            return None
        tensors = {k: v.clone() for k, v in self.runner.state_tensors().items()}  # it may keep training
        return StageState(self.stage_meta(), tensors)

    def _synced_state(self, previous: bool) -> StageState:
        """The state at the last outer sync (``previous``: the one before it; ``LocalSteps.state``)."""
        assert self.local is not None
        step, tensors = self.local.state(self.runner, self._stepped, previous)
        return StageState(self.stage_meta(step), tensors)

    # ---- one step ----------------------------------------------------------------------------------------

    def most_micro_batches(self) -> int:
        """Micro-batches of the replica with the most sequences (replica 0): replicas hold one more
        sequence than others when the batch does not divide evenly, so their counts may differ."""
        per_replica = math.ceil(self.job.sequences_per_step / self.plan.data_replicas)
        return math.ceil(per_replica / self.job.batch.micro_batch_size)

    def micro_batches(self, step: int, replica: int | None = None) -> list[MicroBatch]:
        """This replica's micro-batches of ``step`` (its first wave's, with two), or those of data
        shard ``replica`` (another replica's, for a spot check; shards are replicas without waves)."""
        per_step, n_rep = self.job.sequences_per_step, self.plan.data_replicas
        replica = self.shards[0] if replica is None else replica
        batch = self.dataset.replica_batch(step, replica, n_rep, per_step)
        # With local steps each replica averages over its own sequences; otherwise over the global batch
        # (its gradient is then summed with the other replicas').
        denom = batch.shape[0] if self.diloco is not None else per_step
        out = []
        for inputs, targets in self.dataset.micro_batches(batch, self.job.batch.micro_batch_size):
            n = inputs.shape[0]
            out.append(
                MicroBatch(
                    inputs if self.runner.is_first or self.runner.needs_tokens else None,
                    targets if self.runner.is_last else None,
                    weight=n / denom,
                    share=n / per_step,
                    rows=(n, inputs.shape[1]),
                )
            )
        return out

    def _allreduce_cfg(self, average: bool) -> AllReduceConfig:
        return AllReduceConfig(
            self.grad_codec_spec,
            self.cfg.chunk_elements,
            self.cfg.allreduce_timeout_s,
            average,
            rule=self.plan.stages[self.stage].aggregation,
            trim=self.job.trust.trim,
        )

    async def _sync_gradients(self, rnd: Round, timing: Timing, loss: float, timeout_s: float) -> Ready:
        """The stage's synchronised gradients and this replica's READY; ``LateError``: left out."""
        if self._slowdown_s:
            await asyncio.sleep(self._slowdown_s)  # an injected straggler (testbed/faults.delay)
        t0 = time.perf_counter()
        members = None
        try:
            if self.deadline is not None:
                members = await self.deadline.reduce(rnd, t0 - timing.started, timeout_s)
            elif self.sync is not None:
                await self.sync.finish()  # most buckets are already on their way (overlap)
        finally:
            timing.allreduce += time.perf_counter() - t0
        # a GPU stage's norm waits for the device: off the event loop
        sq = await asyncio.to_thread(self.runner.grad_sq_norm) if self.runner.staging.cuda else None
        sq = self.runner.grad_sq_norm() if sq is None else sq
        return Ready(self.stage, self.replica, sq, loss, members=members)

    async def train_step(self, timeout_s: float | None = None) -> StepReport:
        """One committed step; ``timeout_s`` bounds each of its waits (default: the config's)."""
        timeout_s = self.cfg.step_timeout_s if timeout_s is None else timeout_s
        step, timing = self.step, Timing()
        if self.data_ready is not None:  # a shipped corpus: this step's shards on this disk (data/feed.py)
            await self.data_ready(step)
        sent_before = self.box.bytes_sent
        rnd = Round(self.plan.epoch, step)
        # under the deadline policy a left-out replica may lag its stage by up to max_misses steps
        lag = self.job.sync.max_misses + 2 if self.deadline is not None else None
        self.box.advance(self.plan.epoch, step, lag)
        self.duties.before_step(rnd)
        ready, failed = await self._compute(rnd, timeout_s, timing)
        t0 = time.perf_counter()
        try:
            decision = await commit_step(self.decisions, rnd, ready, timeout_s)
        except StepAborted:
            self.runner.zero_grad()
            raise
        timing.commit += time.perf_counter() - t0
        if failed is not None:  # committed without this replica (deadline policy): it has no update
            self.runner.zero_grad()
            raise failed
        if ready is None:
            assert self.deadline is not None
            t0 = time.perf_counter()
            await self.deadline.catch_up(rnd, timeout_s)
            timing.allreduce += time.perf_counter() - t0
        await self.duties.after_commit(rnd, decision, self.most_micro_batches())
        lr = await self._apply(step, decision, timing)
        since = step if self.local is None else self.local.synced_at  # the last a checkpoint could take
        if self.local is not None:
            await self._outer_sync(self.local, rnd, timing)
        self.step = step + 1
        self._consistent = True
        checkpoint = await self._maybe_checkpoint(since)
        await self._forget(step)
        timing.bytes_sent = self.box.bytes_sent - sent_before  # activations, gradients, buckets, commit
        if self.deadline is not None:
            self.deadline.check()  # a straggler too many steps in a row: reported failed
        ratio = timing.wire_raw / timing.wire_coded if timing.wire_coded else 0.0
        total, st = timing.report()
        logger.debug("step %d on stage %d: %s", step, self.stage, timing.line(total, st))
        return StepReport(step, decision.loss, lr, total, st, timing.bytes_sent, checkpoint, ratio)

    async def _compute(
        self, rnd: Round, timeout_s: float, timing: Timing
    ) -> tuple[Ready | None, PeerError | None]:
        """Forward, backward and the replica sync of step ``rnd``: this replica's READY (None: left out
        of the stage's mean under the deadline policy), or a failed READY and the failure to raise once
        the step is decided."""
        micro = self.micro_batches(rnd.step)
        if self.sync is not None:
            self.sync.arm(rnd, len(micro), timeout_s)
        try:
            if self.waves is not None:  # a whole-model stage: no pipeline neighbours, two shards
                both = [micro, self.micro_batches(rnd.step, self.shards[1])]
                loss_part, seconds = await asyncio.to_thread(self.waves.run, both)
                timing.compute += seconds
            else:
                loss_part = await pipeline_step(
                    self.box,
                    self.runner,
                    self.where,
                    micro,
                    rnd,
                    self.pipe_codecs,
                    timeout_s,
                    timing,
                    self.ledger,
                    self.plan.run_ahead,
                )
                timing.piped = time.perf_counter() - timing.started
                # one signature over its pipeline messages, out now: it reaches the neighbours while
                # they sync their replicas, and their READY does not wait a hop for it
                await self.duties.seal(rnd, timeout_s, timing, check=False)
            ready = await self._sync_gradients(rnd, timing, loss_part, timeout_s)
            await self.duties.seal(rnd, timeout_s, timing)  # the seals of what this peer received
            return ready, None
        except LateError:
            await self.duties.seal(rnd, timeout_s, timing, check=False)
            return None, None  # it votes nothing and catches up after the commit
        except (PipelineError, CollectiveError) as e:
            if isinstance(e, NeighbourError):
                self.box.suspect(e.peer)  # the failure report names the peer that sent it
            self.decisions.give_up(rnd, str(e), [self.where.prev, self.where.next, *self.assignment.peers])
            if self.sync is not None:
                self.sync.disarm()
            await self.duties.seal(rnd, timeout_s, timing, check=False)
            return Ready(self.stage, self.replica, 0.0, 0.0, ok=False, reason=str(e)[:200]), e

    async def _apply(self, step: int, decision: Decision, timing: Timing) -> float:
        """AdamW at the scheduled rate, clipped by the committed global norm; returns the rate."""
        lr = learning_rate(self.job.optimizer, step, self.job.steps)
        coef = clip_coefficient(self.job.optimizer, decision.norms[self.replica])
        t0 = time.perf_counter()
        self._consistent = False  # until self.step says how many steps the weights have taken
        await asyncio.to_thread(self.runner.step, lr, coef)
        self._stepped = step + 1
        if self.waves is not None:
            self.waves.follow()  # the second wave's weights: the first's after the update
        timing.compute += time.perf_counter() - t0
        return lr

    async def _outer_sync(self, local: LocalSteps, rnd: Round, timing: Timing) -> None:
        """Every H steps with local steps, and after the job's last step (so the final model is the
        replicas' agreed one): the coded outer sync with the stage's replicas (``outer.py``).

        With ``compression.outer_overlap`` (the default) a sync that another step of this run follows
        only starts here, and the next step's end lands it (``local.py``). The run's last sync (the
        job's end, a pause, a hand-off) is waited for: a run leaves the state every replica agrees on."""
        local.stepped()
        last = rnd.step + 1 == self.job.steps  # every replica reaches it together (commits are all-or-none)
        due = local.diloco.count(force=last)
        flight = local.in_flight
        # it lands after its delay in inner steps, the same step on every replica, and always before
        # the next sync starts
        if flight is not None and (due or flight.inner_steps >= self.job.compression.landing_delay()):
            await local.land(timing)
        if self.lateness is not None:
            self._compute_s.append(timing.compute)
        if not due:
            return
        peers, timeout = self.assignment.peers, self.cfg.allreduce_timeout_s
        wait_s = None
        if self.lateness is not None:
            pol = self.job.sync
            wait_s = deadline_s(list(self._compute_s), pol.deadline_factor, pol.min_deadline_s, timeout)
        end = min(self._end, self.stop_step if self.stop_step is not None else self._end)
        overlap = self.job.compression.outer_overlap and rnd.step + 1 < end
        clock = Timing() if overlap else timing  # an overlapped exchange counts only its wait at landing
        gather = stage_gather(self.box, peers, local.diloco, rnd, timeout, clock, wait_s, self.lateness)
        sync = lambda t: self._outer_allreduce(t, rnd, clock, overlap)  # noqa: E731
        mine = local.diloco.prepare()
        exchange = outer_mean(local.diloco, mine, sync, gather, peers, self.audit)
        if overlap:
            local.start(rnd.step + 1, mine, exchange, rnd.at(Phase.OUTER).attempts())
            return
        local.diloco.apply_outer(await exchange)
        local.synced(rnd.step + 1)

    async def _settle(self, ended: bool) -> None:
        """The run is over with an overlapped sync still in flight: land it (``LocalSteps.settle``),
        then write the checkpoint a pause or the job's end asks for."""
        local = self.local
        if local is not None and local.in_flight is not None:
            since = local.synced_at
            if await local.settle(ended, min(SETTLE_S, self.budget.timeout_s())):
                await self._maybe_checkpoint(since)

    async def _forget(self, step: int) -> None:
        """Drop what step ``step`` and earlier left buffered (step + 1's early messages stay)."""
        done = before(self.plan.epoch, step + 1)
        for span in self.local.forgettable(done) if self.local is not None else [done]:
            await self.box.forget(span)

    async def _outer_allreduce(
        self, pseudo: torch.Tensor, rnd: Round, timing: Timing, background: bool = False
    ) -> torch.Tensor:
        if self.plan.n_replicas == 1:
            return pseudo
        t0 = time.perf_counter()
        cfg = self._allreduce_cfg(average=True)
        if background:  # small messages, each paced whole (net/pace.py, Background)
            cfg = dataclasses.replace(cfg, chunk_elements=min(cfg.chunk_elements, BACKGROUND_CHUNK_ELEMENTS))
        out = await tree_allreduce(
            self.box, self.schedule, pseudo, rnd.at(Phase.OUTER).pack(), cfg, self.audit
        )
        timing.allreduce += time.perf_counter() - t0
        return out

    async def _maybe_checkpoint(self, since: int) -> Path | None:
        """A checkpoint of the stage's state when a multiple of ``checkpoint.interval`` lies after
        ``since`` (the last step one could be taken at: the step before, or with DiLoCo the sync before)
        and up to it, and at the job's end or a pause. With local steps only synced states are
        checkpointed (between syncs the replicas differ), so H = 16 with an interval of 10 takes one at
        steps 16, 32, 48, 64 and 80, not at every 80th step only; an overlapped sync's state is written
        when it lands, a step later, as the state after its own step."""
        done, ck = self.step, self.job.checkpoint
        if self.local is not None:
            if self.local.synced_at == since:
                return None
            done = self.local.synced_at
        last = done in (self.job.steps, self.stop_step)  # the job's end, or a pause (docs/multijob.md)
        if done // ck.interval == since // ck.interval and not last:
            return None
        if self.local is not None:
            state = self._synced_state(previous=False)
            meta, tensors = state.meta, state.tensors
        else:
            meta, tensors = self.stage_meta(), self.runner.state_tensors()
        root = self.checkpoint_root
        # Every replica writes its own copy to its own disk: no disk is shared, so a stage's checkpoint
        # survives as long as one of its replicas (or the copy holder, or the job owner) does.
        path = await asyncio.to_thread(save_stage, root, tensors, meta)
        await asyncio.to_thread(prune, root, ck.keep, False)  # this disk holds some stages only
        return path

    async def run(
        self,
        on_step: Callable[[StepReport], object] | None = None,
        until: int | None = None,
        on_ready: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """Train until the job's last step (or ``until``); raises ``StepAborted`` when a step cannot be
        committed, leaving weights and optimizer as they were before that step. ``on_ready`` is awaited
        once the state is loaded, before the first step."""
        try:
            await self._restore()
        except Exception as e:  # any failure to take the state: tell the plan's leader, then fail
            await start_barrier(self.box, self.plan, self.cfg.start_wait_s, failed=str(e))
            raise
        if on_ready is not None:
            await on_ready()
        # Nobody steps before everyone holds its state: the first step then needs no extra wait, so a
        # death inside it is noticed within the step budget (barrier.py).
        await start_barrier(self.box, self.plan, self.cfg.start_wait_s)
        end = self._end = self.job.steps if until is None else min(until, self.job.steps)
        drain = True
        self.stepping = True
        ended = False
        try:
            while self.step < end and (self.stop_step is None or self.step < self.stop_step):
                report = await self.train_step(self.budget.timeout_s())
                self.budget.observe(report.seconds)
                if on_step is not None:
                    on_step(report)
            ended = True
        except asyncio.CancelledError:
            drain = False  # a new plan: nobody will wait for this run's catch-up sends
            if self.local is not None:
                self.local.drop()
            raise
        finally:
            if drain:
                await self._settle(ended)
            self.stepping = False
            self.duties.close()
            if self.deadline is not None:  # replicas behind still need the last steps' means
                await self.deadline.close(drain)
