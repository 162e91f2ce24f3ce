"""A trainer's local steps: the overlapped outer sync's landing, its timeout, and the rounds kept for it."""

from __future__ import annotations

import asyncio

import pytest
import torch

from potluck.net.tags import Phase, Round, before
from potluck.peer.collectives.diloco import DiLoCo
from potluck.peer.config import DiLoCoConfig
from potluck.peer.errors import CollectiveError
from potluck.peer.train.local import LocalSteps
from potluck.peer.train.pipeline import Timing


def _local() -> tuple[LocalSteps, torch.nn.Linear]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return LocalSteps(DiLoCo(model.parameters(), DiLoCoConfig(inner_steps=2, outer_lr=1.0)), 0), model


def test_a_sync_in_flight_lands_with_the_inner_steps_under_it_and_moves_the_synced_step() -> None:
    async def main() -> None:
        local, model = _local()
        with torch.no_grad():
            model.weight.add_(1.0)  # two inner steps' worth
        mine = local.diloco.prepare()
        gate = asyncio.Event()

        async def exchange() -> torch.Tensor:
            await gate.wait()
            return mine.pseudo.clone()  # a stage of one: its own pseudo-gradient is the mean

        local.start(2, mine, exchange())
        with torch.no_grad():
            model.weight.add_(0.5)  # the step under the sync
        local.stepped()
        assert local.synced_at == 0 and local.in_flight is not None
        assert local.forgettable(before(0, 3)) != [before(0, 3)]
        gate.set()
        timing = Timing()
        await local.land(timing)
        assert (local.synced_at, local.synced_before, local.in_flight) == (2, 0, None)
        # outer lr 1, no momentum: the snapshot is where the two steps went; the weights keep the third
        assert torch.allclose(local.diloco.snapshot[0], model.weight.detach() - 0.5)
        assert timing.allreduce >= 0.0

    asyncio.run(main())


def test_a_sync_that_does_not_land_in_time_is_dropped_and_the_synced_state_stays() -> None:
    async def main() -> None:
        local, _ = _local()
        never: asyncio.Future[torch.Tensor] = asyncio.get_running_loop().create_future()
        local.start(2, local.diloco.prepare(), never)
        with pytest.raises(CollectiveError, match="did not end"):
            await local.land(timeout_s=0.05)
        assert never.cancelled() and local.in_flight is None and local.synced_at == 0

    asyncio.run(main())


def test_the_mailbox_keeps_the_rounds_of_the_sync_in_flight() -> None:
    async def main() -> None:
        local, _ = _local()
        local.start(5, local.diloco.prepare(), asyncio.sleep(0, torch.zeros(1)))
        spans = local.forgettable(before(3, 5))
        outer = Round(3, 4, Phase.OUTER)
        assert not any(outer.retry(a).pack() in s for s in spans for a in range(8))
        gone = [Round(3, 4), Round(3, 4, Phase.BUCKETS), Round(3, 3, Phase.OUTER), Round(2, 9)]
        assert all(any(r.pack() in s for s in spans) for r in gone)  # the rest still goes
        assert not any(Round(3, 5).pack() in s for s in spans)  # the next step's early messages stay
        local.drop()

    asyncio.run(main())


def test_a_sync_in_flight_is_background_traffic_until_someone_waits_for_it() -> None:
    from potluck.net.pace import Background

    async def main() -> None:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        bg = Background()
        local = LocalSteps(DiLoCo(model.parameters(), DiLoCoConfig(inner_steps=2, outer_lr=1.0)), 0, bg)
        mine = local.diloco.prepare()
        span = Round(0, 1, Phase.OUTER).attempts()
        done: asyncio.Future[torch.Tensor] = asyncio.get_running_loop().create_future()
        local.start(2, mine, done, span)
        assert bg.span == span  # its messages go in the pipeline's gaps
        done.set_result(mine.pseudo.clone())
        await local.land()
        assert bg.span is None  # landing waits for it: the rest would go at full speed
        local.start(4, local.diloco.prepare(), asyncio.get_running_loop().create_future(), span)
        local.drop()
        assert bg.span is None and local.in_flight is None

    asyncio.run(main())
