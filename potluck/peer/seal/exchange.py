"""The step seal on the wire: when a checked step's pipeline sends are done, each peer seals them
(``Ledger.close``) and sends each peer it sent to its seal (``deliver_seals``); before it votes READY it
checks the seal of every peer it holds bare messages from (``check_seals``, ``Ledger.accept``).

It costs one short message per link and step and one signature check per sender, where sealing each
message cost one signature per message on both ends. The seal goes out before the sender's replica
sync, so it is usually there by the time the neighbour checks it.
"""

from __future__ import annotations

import asyncio
import logging

from potluck.net.mailbox import Mailbox
from potluck.net.tags import Round, Stream, Tag, make_tag
from potluck.peer.errors import SealError
from potluck.peer.seal.ledger import Ledger
from potluck.protocol.errors import WireError

logger = logging.getLogger(__name__)


def _tag(rnd: Round) -> Tag:
    return make_tag(Round(rnd.epoch, rnd.step), Stream.SEAL)


async def deliver_seals(box: Mailbox, rnd: Round, seals: dict[str, bytes]) -> None:
    """Send each receiver its seal of step ``rnd`` (from ``Ledger.close``); a receiver that is gone is
    logged, not raised: it is the one that would need the seal."""
    failed = await asyncio.gather(*(box.send_quietly(peer, _tag(rnd), seal) for peer, seal in seals.items()))
    for peer, why in zip(seals, failed, strict=True):
        if why is not None:
            logger.info("step %d: the step seal for %s did not go out: %s", rnd.step, peer, why)


async def check_seals(box: Mailbox, ledger: Ledger, rnd: Round, timeout_s: float) -> None:
    """Check the step seal of every peer this peer received from in step ``rnd``; ``SealError`` naming a
    sender whose seal is missing, malformed or does not match what it sent."""

    async def check(sender: str) -> None:
        try:
            data = await box.recv(sender, _tag(rnd), timeout_s)
        except (TimeoutError, WireError) as e:
            raise SealError(sender, f"no step seal from {sender} for step {rnd.step}: {e}") from None
        ledger.accept(sender, rnd, data)

    await asyncio.gather(*(check(s) for s in ledger.awaiting(rnd)))
