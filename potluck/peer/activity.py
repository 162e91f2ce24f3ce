"""What this peer is doing and has done, as the volunteer and the telemetry see it.

The worker writes it (a plan placed or spared it, it took its state, a step committed or was aborted);
``peer/telemetry.py`` and the CLI's status line read it. Events go to ``on_event`` as they happen (the
telemetry publisher queues them; nothing here waits on the network).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

logger = logging.getLogger(__name__)

Phase = Literal["idle", "spare", "syncing", "training", "failed", "done"]
EventData = dict[str, float | int | str | None]


@dataclass
class Activity:
    phase: Phase = "idle"  # under the plan the worker follows
    epoch: int | None = None
    job: str | None = None
    stage: int | None = None
    replica: int | None = None
    step: int = 0  # steps done under the current run (the next step to run)
    why: str = ""  # the spare reason, or the failure
    last_step_at: float = 0.0  # monotonic s of the newest committed step (0: none yet)
    last_abort: str = ""  # "step N (epoch E): reason" of the newest step that did not commit
    steps_contributed: int = 0
    tokens_contributed: int = 0
    flops_contributed: float = 0.0  # 6 x its stage's parameters x its tokens (forward + backward)
    state_received: tuple[str, float, int] | None = None  # (source, seconds, bytes) of the newest state taken
    activation_ratio: float = 0.0  # raw fp32 bytes / wire bytes of its last step's activations (0: none)
    gradient_ratio: float = 0.0  # the same for its gradients, from the codec's payload size
    on_event: Callable[[str, str, EventData], None] | None = field(default=None, repr=False)

    def event(self, kind: str, detail: str, **data: float | int | str | None) -> None:
        if self.on_event is not None:
            try:
                self.on_event(kind, detail, data)
            except Exception:  # telemetry must never break training
                logger.exception("telemetry event %s not queued", kind)

    def placed(
        self, job: str, epoch: int, stage: int, replica: int, start: int, layers: str, waves: int = 1
    ) -> None:
        self.job, self.epoch, self.stage, self.replica, self.step = job, epoch, stage, replica, start
        self.phase, self.why = "syncing", ""
        two = ", two replicas' shares as tick-tock waves" if waves == 2 else ""
        self.event(
            "placed",
            f"stage {stage} (layers {layers}), replica {replica} of plan epoch {epoch}{two}",
            epoch=epoch,
            stage=stage,
            replica=replica,
            start_step=start,
        )

    def spared(self, job: str, epoch: int, why: str) -> None:
        changed = self.phase != "spare" or self.why != why
        self.job, self.epoch, self.stage, self.replica = job, epoch, None, None
        self.phase, self.why = "spare", why
        if changed:
            self.event("spare", why, epoch=epoch)

    def took_state(self, source: str, seconds: float, nbytes: int, step: int) -> None:
        self.state_received = (source, seconds, nbytes)
        self.event(
            "state_received",
            f"step {step} from {source} ({nbytes / 1e6:.1f} MB in {seconds:.1f} s)",
            source=source[:100],
            seconds=round(seconds, 3),
            bytes=nbytes,
            step=step,
        )

    def committed(self, step: int, tokens: int, flops: float) -> None:
        self.phase, self.step, self.last_step_at = "training", step + 1, time.monotonic()
        self.steps_contributed += 1
        self.tokens_contributed += tokens
        self.flops_contributed += flops

    def failed(self, step: int, reason: str) -> None:
        self.phase, self.why = "failed", reason
        self.last_abort = f"step {step} (epoch {self.epoch}): {reason}"[:500]
        self.event("step_aborted", reason[:500], epoch=self.epoch, step=step)

    def waiting(self, reason: str) -> None:
        """The coordinator says why the job has no plan that runs now (``TrainPlan.waiting``): this
        peer's line and status message show it (the coordinator's own telemetry reports the wait)."""
        self.why = reason

    def finished(self, step: int) -> None:
        self.phase, self.step, self.why = "done", step, "the job is done"
