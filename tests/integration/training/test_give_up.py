"""A peer whose step failed says so to the peers that may wait on its messages (``Decisions.give_up``):
their waits on what it would have sent fail at once, their waits on anyone else go on. Real p2pd
daemons on loopback, one process."""

from __future__ import annotations

import asyncio
import time

import pytest

from potluck.net.config import TransportConfig
from potluck.net.mailbox import Mailbox
from potluck.net.tags import Round, Stream, make_tag
from potluck.peer.train.termination import Decisions
from potluck.protocol.errors import WireError
from potluck.testbed.harness.p2p import keyed_group
from potluck.testbed.harness.training import PROTOCOL, make_plan, tiny_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_a_peer_that_gave_its_step_up_is_waited_for_no_longer(tmp_path):
    """Churn run L: a stage-1 replica whose all-reduce partner was killed stopped inside its backward;
    the leader, its pipeline neighbour, waited 2 s for gradients that would never come (out of reach of
    its own early abort, which starts at the commit), and the repair started behind the survivors."""

    async def main() -> None:
        async with keyed_group(4, tmp_path) as nodes:
            ids = [identity.peer_id for _, identity in nodes]
            plan = make_plan(tiny_job(), [ids[:2], ids[2:]], [(0, 2), (2, 4)], epoch=3)
            boxes = [Mailbox(p2p, PROTOCOL, TransportConfig(timeout_s=30.0)) for p2p, _ in nodes]
            for box in boxes:
                await box.start()
            decisions = [Decisions(b, plan, identity) for b, (_, identity) in zip(boxes, nodes, strict=True)]
            leader, quitter = boxes[0], boxes[2]
            rnd = Round(3, 41)
            grads = make_tag(rnd, Stream.ACTIVATION_GRADS)
            t0 = time.monotonic()
            on_quitter = asyncio.create_task(leader.recv(quitter.peer_id, grads, 30.0))
            on_other = asyncio.create_task(leader.recv(boxes[1].peer_id, grads, 30.0))
            await asyncio.sleep(0.5)
            decisions[2].give_up(rnd, "its all-reduce partner is gone", [ids[0], ids[3]])
            with pytest.raises(WireError, match="gave step 41 up: its all-reduce partner is gone"):
                await on_quitter
            assert time.monotonic() - t0 < 5.0
            assert not on_other.done()  # only what the quitter would have sent
            with pytest.raises(WireError, match="gave step 41 up"):  # a wait begun later fails at once
                await leader.recv(quitter.peer_id, grads, 30.0)
            with pytest.raises(TimeoutError):  # the next step's messages are waited for as before
                await asyncio.wait_for(
                    leader.recv(quitter.peer_id, make_tag(Round(3, 42), Stream.ACTIVATION_GRADS)), 1.0
                )
            on_other.cancel()
            for box in boxes:
                await box.close()

    asyncio.run(main())
