"""A peer's duty to keep a second copy of a one-replica stage's checkpoints on its own disk.

Every replica writes its own stage's checkpoints, so a stage with two or more replicas has its
checkpoints on as many disks. A stage with a single replica would have them on one disk only; the plan
names a copy holder for it (``TrainPlan.copy_holder``: replica 0 of the next stage). Right after writing
its own checkpoint at step s, the copy holder pulls that stage's layers at step s from the stage's peer
(which serves them from its disk, ``transfer/server.py``) and writes them next to its own
(``transfer/copy.py``, the routine the job owner's copy uses too). The copy runs
in the background at a bounded rate, so it never holds up training; one that fails is logged and the
next checkpoint tries again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

from potluck.net.streams import Streams
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.training import TrainPlan
from potluck.transfer.copy import Background, copy_stage
from potluck.transfer.errors import StateError
from potluck.transfer.server import TransferConfig, state_protocol

logger = logging.getLogger(__name__)

COPY_RATE_BYTES_S = 8e6  # bytes/s a background copy may take: a fraction of a home link
COPY_TIMEOUT_S = 600.0  # one stage's copy, seconds


def copies_due(plan: TrainPlan, peer_id: str) -> list[int]:
    """The stages of ``plan`` whose checkpoints ``peer_id`` keeps a copy of."""
    return [j for j in range(len(plan.stages)) if plan.copy_holder(j) == peer_id]


class CopyDuty:
    def __init__(
        self,
        streams: Streams,
        swarm_id: str,
        peer_id: str,
        cfg: TransferConfig,
        on_copied: Callable[[Path], None] | None = None,
    ) -> None:
        """``on_copied(root)``: called after a copy was written under ``root``."""
        self.streams, self.swarm_id, self.peer_id, self.on_copied = streams, swarm_id, peer_id, on_copied
        self.cfg = dataclasses.replace(cfg, rate_bytes_s=COPY_RATE_BYTES_S)
        self.protocol = state_protocol(swarm_id)
        self.background = Background()
        self.copied: list[tuple[int, int]] = []  # (stage, step) copies written, for tests and logs

    def after_checkpoint(self, job: JobSpec, plan: TrainPlan, step: int, root: Path) -> None:
        """This peer wrote its checkpoint at ``step`` under ``root``: copy the stages it holds copies of."""
        stages = copies_due(plan, self.peer_id)
        if not stages:
            return
        if not self.background.idle:
            logger.info("checkpoint copy still running; step %d is not copied", step)
            return
        self.background.start(self._copy(job, plan, step, root, stages), f"copy-{step}")

    async def _copy(self, job: JobSpec, plan: TrainPlan, step: int, root: Path, stages: list[int]) -> None:
        for j in stages:
            a = plan.stages[j]
            try:
                await copy_stage(
                    self.streams, self.protocol, a.peers, job, plan, j, step, root, self.cfg, COPY_TIMEOUT_S
                )
            except StateError as e:
                logger.warning("no copy of stage %d at step %d: %s", j, step, e)
                continue
            except OSError as e:
                logger.error("copy of stage %d at step %d not written to %s: %s", j, step, root, e)
                continue
            self.copied.append((j, step))
            if self.on_copied is not None:
                self.on_copied(root)
            logger.info("kept a copy of stage %d at step %d (its only replica is %s)", j, step, a.peers[0])

    async def close(self) -> None:
        await self.background.close()
