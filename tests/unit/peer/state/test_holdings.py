"""What a peer reports holding (``peer/state/holdings.py``): the coordinator resumes from these reports."""

from dataclasses import dataclass, field

import torch

from potluck.peer.state.holdings import Holdings
from potluck.protocol.checkpoints import StageMeta
from potluck.protocol.training import Holding, StageAssignment
from potluck.transfer.snapshot import StageState
from tests.unit.coordinator.job.test_plan import JOB
from tests.unit.coordinator.job.test_progress import PLAN


@dataclass
class Server:
    """The three calls ``Holdings`` makes of a ``StateServer``, recorded."""

    offered_all: list[StageState] = field(default_factory=list)
    live: object = "unset"

    @property
    def offered(self) -> StageState | None:
        return self.offered_all[0] if self.offered_all else None

    def offer(self, state: StageState) -> None:
        self.offered_all.insert(0, state)

    def offer_live(self, snapshot: object) -> None:
        self.live = snapshot


def state(step: int, first: int = 0, last: int = 2, job: str = JOB.name) -> StageState:
    meta = StageMeta(
        job=job, step=step, stage=0, n_stages=2, first_layer=first, last_layer=last,
        model=JOB.model, seed=JOB.seed, tokenizer=None, epoch=1,
    )  # fmt: skip
    return StageState(meta, {"w": torch.zeros(1)})


@dataclass
class Run:
    step: int
    end: StageState | None
    taken: int = 0

    def snapshots(self) -> list[StageState]:
        self.taken += 1
        return [self.end] if self.end is not None else []


def test_a_run_that_ends_is_offered_once_and_reported():
    server = Server()
    h = Holdings(server)  # type: ignore[arg-type]
    run = Run(12, state(12))
    h.keep(run)
    h.keep(run)  # once per run
    assert run.taken == 1 and server.live is None and len(server.offered_all) == 1
    assert h.reported() == Holding(step=12, first_layer=0, last_layer=2)
    h.keep(Run(13, None))  # a torn state is never offered; what was held stays reported
    assert len(server.offered_all) == 1 and h.reported() == Holding(step=12, first_layer=0, last_layer=2)
    h.keep(Run(20, state(20, 2, 4)))
    assert h.also_held() == [Holding(step=12, first_layer=0, last_layer=2)]


def test_a_peer_that_cannot_serve_reports_holding_nothing():
    h = Holdings(None)
    h.at(5, StageAssignment(first_layer=0, last_layer=2, peers=PLAN.stages[0].peers))
    assert h.reported() is None and h.also_held() == []


def test_a_run_failing_before_it_took_state_reports_the_newer_step_it_still_holds():
    server = Server()
    h = Holdings(server)  # type: ignore[arg-type]
    h.keep(Run(30, state(30)))
    start = PLAN.model_copy(update={"start_step": 20})
    assert h.reported_step(start, None) == 30  # the plan asked for an older step than it holds
    assert h.reported_step(start, Run(25, None)) == 25  # a run that stepped reports its own step
    other = PLAN.model_copy(update={"start_step": 20, "job": "other"})
    assert h.reported_step(other, None) == 20  # another job's state says nothing of this one


def test_a_peer_whose_disk_keeps_the_pause_step_of_its_layers_stores_it():
    """A peer back from another job's lease skips a paused epoch only when its disk keeps that pause's
    step (or a later one) of exactly its stage's layers (``PlanWorker._stopped_there``)."""
    holdings = Holdings(None)
    a = StageAssignment(first_layer=0, last_layer=2, peers=PLAN.stages[0].peers)
    assert not holdings.stores(10, a)  # nothing read from disk yet
    holdings.stored = [
        Holding(step=10, first_layer=0, last_layer=2),
        Holding(step=30, first_layer=2, last_layer=4),
    ]
    assert holdings.stores(10, a) and holdings.stores(5, a)
    assert not holdings.stores(11, a)  # an older checkpoint: the peer must still train up to the pause
    assert not holdings.stores(
        10, StageAssignment(first_layer=0, last_layer=3, peers=PLAN.stages[0].peers)
    )  # other layers
