"""The job owner's checkpoint copy: the coordinator pulls each complete checkpoint into ``checkpoint.dir``.

No disk is shared, so a checkpoint first exists only on the peers that wrote it (every replica writes its
own stage; a stage with one replica is also copied by a designated peer, ``TrainPlan.copy_holder``).
When every stage of the current plan has reported a checkpoint at step s (``JobProgress``), the
coordinator pulls each stage's layers at s from the peers of the plan (several at once, chunks hashed
and checked against the holder's signed manifest, ``transfer/pull.py``), at most ``rate_bytes_s`` so a
home uplink keeps its training traffic, and writes them under the job owner's directory. It then serves
that directory to peers like any holder: when a stage loses every replica and its copy, the swarm still
resumes from the owner's copy over P2P.

Only checkpoints written under the current plan are copied (s > the plan's start step), so the layers of
each stage are the plan's own. The job's last checkpoint is the exception, when a plan starts there. A
copy that fails (a holder died) is logged once and not retried: the next checkpoint, or the same one
under the next plan, is.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from potluck.net.streams import Streams
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import TrainPlan
from potluck.transfer.blobs import BlobServer, blob_files
from potluck.transfer.copy import Background, copy_stage, prune_copies
from potluck.transfer.errors import StateError
from potluck.transfer.server import Gate, StateServer, TransferConfig, state_protocol

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CopyReport:
    step: int
    bytes: int
    seconds: float


class CheckpointCopier:
    """Pulls complete checkpoints of one job into ``root``, one at a time, newest wins."""

    def __init__(self, streams: Streams, swarm_id: str, job: JobSpec, root: Path, cfg: TransferConfig):
        self.streams, self.job, self.root, self.cfg = streams, job, Path(root), cfg
        self.protocol = state_protocol(swarm_id)
        self.copied = 0  # newest step copied completely
        self.last: CopyReport | None = None
        self.background = Background()
        self._failed: tuple[int, int] | None = None  # (epoch, step) of a failed copy: not retried

    def want(self, plan: TrainPlan, step: int) -> bool:
        """Whether a checkpoint at ``step`` that every stage reported under ``plan`` should be copied."""
        idle = self.background.idle
        # A plan starting at the job's last step (a hand-off that reached the end: the leavers trained
        # on to it) writes nothing more, so the last checkpoint, written under the plan before, is
        # copied under this one; any earlier start step's checkpoint is the older plan's to copy.
        floor = plan.start_step - 1 if plan.start_step == step == self.job.steps else plan.start_step
        return step > max(self.copied, floor) and idle and (plan.epoch, step) != self._failed

    def start(self, plan: TrainPlan, step: int) -> None:
        """Copy ``step`` in the background (the caller checked ``want``)."""
        self.background.start(self._copy_logged(plan, step), f"copy-checkpoint-{step}")

    async def flush(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for a copy under way (the job's final checkpoint before exit)."""
        await self.background.flush(timeout_s)

    async def close(self) -> None:
        await self.background.close()

    async def _copy_logged(self, plan: TrainPlan, step: int) -> None:
        try:
            self.last = await self.copy(plan, step)
            return
        except StateError as e:
            logger.warning("checkpoint at step %d not copied to %s: %s", step, self.root, e)
        except OSError as e:
            logger.error("checkpoint at step %d not written to %s: %s", step, self.root, e)
        self._failed = (plan.epoch, step)  # the next checkpoint or plan tries again

    async def copy(self, plan: TrainPlan, step: int) -> CopyReport:
        """Pull every stage of ``step`` from the plan's peers and write it under ``root``."""
        started = time.monotonic()
        peers = [p for st in plan.stages for p in st.peers]
        total = 0
        for j, a in enumerate(plan.stages):
            # Its replicas first; every other peer of the plan is asked too (the designated copy holder
            # of a one-replica stage, or a peer that kept it from an earlier epoch): those without it
            # say so and drop out.
            holders = list(dict.fromkeys([*a.peers, *peers]))
            total += await copy_stage(
                self.streams,
                self.protocol,
                holders,
                self.job,
                plan,
                j,
                step,
                self.root,
                self.cfg,
                self.cfg.deadline_s,
            )
        await prune_copies(self.root, self.job.checkpoint.keep)
        self.copied = max(self.copied, step)
        report = CopyReport(step, total, time.monotonic() - started)
        logger.info(
            "copied checkpoint step %d to %s: %.1f MB in %.1f s",
            step,
            self.root,
            total / 1e6,
            report.seconds,
        )
        return report


class OwnerCopy:
    """The job owner's copy on the coordinator's machine: served to peers always (the last resort when a
    stage lost every holder), kept current by a ``CheckpointCopier`` when ``copy`` is on."""

    def __init__(
        self,
        streams: Streams,
        swarm_id: str,
        identity: Identity,
        job: JobSpec,
        root: Path,
        copy_mb_s: float | None,
        gate: Gate | None = None,
        corpus: Path | None = None,
    ) -> None:
        """``copy_mb_s``: the copy's cap in MB/s (0: none); None: serve ``root`` but copy nothing.
        ``gate``: who may fetch the copy (admitted peers). ``corpus``: the job's shipped corpus (its
        manifest and shards, each file named by its SHA-256), served to the same peers."""
        self.server = StateServer(streams, swarm_id, identity, TransferConfig(), gate)
        self.server.serve_disk(job.name, root)
        self.blobs = BlobServer(streams, swarm_id, blob_files(corpus), gate) if corpus is not None else None
        self.copier: CheckpointCopier | None = None
        if copy_mb_s is not None:
            rate = TransferConfig(rate_bytes_s=copy_mb_s * 1e6)
            self.copier = CheckpointCopier(streams, swarm_id, job, root, rate)

    async def start(self) -> None:
        await self.server.start()
        if self.blobs is not None:
            await self.blobs.start()

    def tick(self, plan: TrainPlan | None, complete_step: int) -> bool:
        """Start copying ``complete_step`` (the newest checkpoint every stage of ``plan`` reported) if it
        is new and no copy is running; True if one started."""
        if self.copier is None or plan is None or not self.copier.want(plan, complete_step):
            return False
        self.copier.start(plan, complete_step)
        return True

    async def final(self, plan: TrainPlan | None, complete_step: int, timeout_s: float) -> None:
        """At the job's end: copy its last checkpoint, waiting ``timeout_s`` at most (the owner's copy is
        what `potluck generate` and a later launch read)."""
        if self.copier is None:
            return
        deadline = time.monotonic() + timeout_s
        await self.copier.flush(timeout_s)  # an earlier checkpoint's copy may still be under way
        if self.tick(plan, complete_step):
            await self.copier.flush(max(0.0, deadline - time.monotonic()))

    async def close(self) -> None:
        if self.copier is not None:
            await self.copier.close()
        await self.server.close()
        if self.blobs is not None:
            await self.blobs.close()
