"""What this peer holds of a job's state, as its progress records say it (``Progress.holds``, ``stored``,
``also_holds``): the coordinator resumes a new plan from the newest step live peers report holding, so
these reports are what lets a swarm lose a peer without restarting from an older checkpoint.

- ``held``: the stage state in this peer's memory and the step it is at (set when a run takes its state,
  after each committed step, and when a run ends and its state is kept to serve);
- ``stored``: the checkpoints its own disk keeps (manifests only, read in place);
- ``also_held``: older states it still serves besides the newest (``StateServer.offer``).

A peer without a key to sign state manifests serves nothing, and holds nothing it could hand over.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from potluck.model.resume import kept
from potluck.protocol.training import Holding, StageAssignment, TrainPlan
from potluck.transfer.server import StateServer
from potluck.transfer.snapshot import StageState


class Run(Protocol):
    """A training run, as far as holding its state goes (``peer/train/trainer.Trainer``)."""

    step: int

    def snapshots(self) -> list[StageState]: ...


class Holdings:
    def __init__(self, server: StateServer | None) -> None:
        self.server = server  # None: no key to sign manifests, so nothing is offered
        self.held: Holding | None = None
        self.stored: list[Holding] = []
        self._kept: Run | None = None  # the run whose end state is offered

    @staticmethod
    def _of(step: int, a: StageAssignment) -> Holding:
        return Holding(step=step, first_layer=a.first_layer, last_layer=a.last_layer)

    def at(self, step: int, a: StageAssignment) -> None:
        """This peer's memory holds stage ``a``'s layers after ``step`` steps."""
        self.held = self._of(step, a)

    def keep(self, run: Run | None) -> None:
        """Serve what ``run`` ended with until the next run ends (once per run; a torn state is never
        offered), and say so in the progress records."""
        if self.server is None or run is None or run is self._kept:
            return
        self._kept = run
        self.server.offer_live(None)
        for held in run.snapshots():  # oldest first: the newest ends up offered first
            self.server.offer(held)
            meta = held.meta
            self.held = Holding(step=meta.step, first_layer=meta.first_layer, last_layer=meta.last_layer)

    def look_at_disk(self, root: Path) -> None:
        """Note which checkpoints ``root`` keeps (manifests only: a few small files, read in place)."""
        self.stored = [Holding(step=s, first_layer=a, last_layer=b) for s, a, b in kept(root)]

    def stores(self, step: int, a: StageAssignment) -> bool:
        """Whether this peer's disk (as ``look_at_disk`` last read it) keeps stage ``a``'s layers at
        ``step`` or later."""
        return any(
            h.step >= step and (h.first_layer, h.last_layer) == (a.first_layer, a.last_layer)
            for h in self.stored
        )

    def reported(self) -> Holding | None:
        """``held`` as a record may claim it: only a peer that can serve it."""
        return self.held if self.server is not None else None

    def also_held(self) -> list[Holding]:
        """The states this peer offers besides its newest, for the report."""
        extra = self.server.offered_all[1:] if self.server is not None else []
        return [
            Holding(step=s.meta.step, first_layer=s.meta.first_layer, last_layer=s.meta.last_layer)
            for s in extra
        ]

    def reported_step(self, plan: TrainPlan, run: Run | None) -> int:
        """The step a failed run reports: the run's, or, when the run failed before it took any state,
        the newer step this peer still holds in memory for the job. The coordinator resumes the next
        epoch from the newest step live peers report, so a plan that asked for an older step than the
        survivors hold (their last commit raced the re-plan) is corrected on the next try."""
        step = run.step if run is not None else plan.start_step
        held = self.server.offered if self.server is not None else None
        if held is not None and held.meta.job == plan.job and step == plan.start_step:
            return max(step, held.meta.step)
        return step
