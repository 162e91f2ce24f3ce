"""What `potluck launch` and `potluck demo` show of a running job: the plan, the steps, the summary.

``JobWatcher`` receives the coordinator service's events (a new plan, fresh progress records;
``coordinator/events.py``) and keeps what a person wants to see: the swarm's step, the loss of the last
step, tokens per second (the service's one figure, ``telemetry.summary``: the dashboard and /metrics
show the same) and where the newest checkpoint is. Rendering is a line per step (launch) or a rich
progress bar (demo); the one-line JSON summary is the same for both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from potluck.cli.common import err_console
from potluck.coordinator.events import PlanPublished, ProgressRead
from potluck.coordinator.job.progress import JobProgress
from potluck.coordinator.state import SwarmState
from potluck.protocol.jobspec import CompressionSpec, JobSpec
from potluck.protocol.training import StepTiming, TrainPlan
from potluck.telemetry.summary import Throughput


def plan_table(plan: TrainPlan, reason: str) -> Table:
    shards = f" ({plan.data_replicas} with tick-tock waves)" if plan.data_replicas != plan.n_replicas else ""
    # a bottleneck job's positions (model/bottleneck.py), when the plan names them
    at = f"; bottlenecks at layer(s) {', '.join(map(str, plan.bottlenecks))}" if plan.bottlenecks else ""
    # compression = "auto": what the coordinator chose and why, on a line of its own (never cut short)
    main, _, auto = reason.partition("; compression auto: ")
    chose = f"\ncompression (auto): {compression_line(plan.compression)}; {auto}" if plan.compression else ""
    table = Table(
        title=f"plan epoch {plan.epoch}: {len(plan.stages)} stages x {plan.n_replicas} replicas{shards}, "
        f"from step {plan.start_step}{at}",
        caption=main[:200] + chose,
    )
    table.add_column("stage")
    table.add_column("layers")
    table.add_column("replicas (peer ids)")
    table.add_column("trees", justify="right")
    for j, st in enumerate(plan.stages):
        waves = st.waves or [1] * len(st.peers)
        named = [p[:12] + (" (2 waves)" if w == 2 else "") for p, w in zip(st.peers, waves, strict=True)]
        peers = ", ".join(named)
        table.add_row(str(j), f"{st.first_layer}-{st.last_layer - 1}", peers, str(len(st.trees) or "1-hop"))
    for spare in plan.spares:
        table.add_row("spare", "", spare.peer_id[:12], spare.reason)
    return table


def compression_line(comp: CompressionSpec) -> str:
    """The settings a plan runs with, as a user would write them in ``[compression]``."""
    acts = comp.activations
    if comp.activations_slow is not None:
        acts += f", {comp.activations_slow} under {comp.slow_link_gbps:g} Gbit/s"
    line = f"activations {acts}; gradients {comp.gradients}"
    if comp.sync_every > 1:
        line += f"; sync every {comp.sync_every} steps"
    if comp.outer is not None:
        line += f", outer {comp.outer} (lr {comp.outer_lr:g})"
    return line


@dataclass
class JobWatcher:
    job: JobSpec
    checkpoint_root: Path
    throughput: Callable[[], Throughput | None]  # the service's figure (``service.throughput``)
    bar: bool = False  # a rich progress bar (demo) instead of a line per step (launch)
    plan: TrainPlan | None = None
    losses: dict[int, float] = field(default_factory=dict)  # step (1-based: steps done) -> loss
    shown = 0  # the newest step shown
    checkpoint_step: int | None = None
    bytes_per_step: dict[str, int] = field(default_factory=dict)  # peer -> bytes it sent in its last step
    timings: dict[str, dict[int, StepTiming]] = field(default_factory=dict)  # peer -> step -> its timing
    swarm_state: SwarmState | None = None
    _progress: Progress | None = None
    _task: Any = None

    def __enter__(self) -> JobWatcher:
        if self.bar:
            self._progress = Progress(
                TextColumn("[bold]training[/]"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                console=err_console,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("steps", total=self.job.steps, info="waiting for the plan")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def handle(self, event: object) -> None:
        """An event of the coordinator service (``service.events.subscribe(watcher.handle)``)."""
        if isinstance(event, PlanPublished):
            self.on_plan(event.plan, event.reason)
        elif isinstance(event, ProgressRead):
            self.on_progress(event.plan, event.progress)

    def on_plan(self, plan: TrainPlan, reason: str) -> None:
        old = self.plan
        same = old is not None and old.epoch == plan.epoch  # re-published: spares, a pause, a wait
        self.plan = plan
        console = self._progress.console if self._progress is not None else err_console
        if not same:
            console.print(plan_table(plan, reason))
            return
        if plan.waiting is not None and (old is None or (old.waiting, old.gone) != (plan.waiting, plan.gone)):
            gone = ", ".join(p[:12] for p in plan.gone)
            line = f"plan epoch {plan.epoch} waits: {plan.waiting} (gone: {gone})"
            console.print(line, highlight=False, soft_wrap=True)  # one line: scripts grep for it
            return
        if plan.stop_at is not None:
            console.print(
                f"plan epoch {plan.epoch} pauses after step {plan.stop_at}: {reason}", highlight=False
            )
        for spare in plan.spares:
            console.print(
                f"spare in plan epoch {plan.epoch}: {spare.peer_id[:12]}: {spare.reason}", highlight=False
            )

    def on_progress(self, plan: TrainPlan, progress: JobProgress) -> None:
        last_stage = plan.stages[-1].peers
        for rec in progress.latest.values():
            if rec.peer_id in last_stage and rec.loss is not None and rec.step > 0:
                self.losses.setdefault(rec.step, rec.loss)
            self.bytes_per_step[rec.peer_id] = rec.bytes_sent_per_step
            if rec.state == "training" and rec.timing.total > 0:
                self.timings.setdefault(rec.peer_id, {})[rec.step] = rec.timing
        done = progress.complete_checkpoint()
        if done:
            self.checkpoint_step = done
        seen = self.throughput()
        if seen is not None and seen.step > self.shown:
            self.shown = seen.step
            self._show(seen)

    @property
    def tokens_per_s(self) -> float:
        seen = self.throughput()
        return seen.tokens_per_s if seen is not None else 0.0

    def _show(self, seen: Throughput) -> None:
        loss = self.losses.get(max(self.losses)) if self.losses else None
        info = f"loss {loss:.3f}  {seen.tokens_per_s:,.0f} tok/s" if loss is not None else ""
        if self._progress is not None:
            self._progress.update(self._task, completed=seen.step, info=info)
        else:
            err_console.print(f"step {seen.step}/{self.job.steps}  {info}", highlight=False)

    def checkpoint_path(self) -> str | None:
        if self.checkpoint_step is None:
            return None
        return str(self.checkpoint_root / f"step-{self.checkpoint_step:08d}")

    def summary(self) -> dict[str, object]:
        steps = sorted(self.losses)
        return {
            "steps": self.shown,
            "loss_first": round(self.losses[steps[0]], 4) if steps else None,
            "loss_last": round(self.losses[steps[-1]], 4) if steps else None,
            "tokens_per_s": round(self.tokens_per_s, 1),
            "stages": len(self.plan.stages) if self.plan else 0,
            "replicas": self.plan.n_replicas if self.plan else 0,
            "checkpoint": self.checkpoint_path(),
            "bytes_per_step": sum(self.bytes_per_step.values()),
        }
