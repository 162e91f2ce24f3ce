"""The step-seal exchange on the wire: after a checked step's last message, each peer sends its step
seal (``Ledger.close``) to every peer it sent to, and checks the seal of every peer it holds bare
messages from (``Ledger.accept``) before it votes READY.

It costs one short message per link and step and one signature check per sender, where sealing each
message cost one signature per message on both ends. A trainer sends its seal as soon as its pipeline
sends are done (``send_seals``), before its replica sync, so the seal is usually there by the time the
neighbour checks it (``exchange_seals`` then sends nothing more: the step is closed).
"""

from __future__ import annotations

import asyncio
import logging

from potluck.net.mailbox import Mailbox
from potluck.net.tags import Round, Stream, make_tag
from potluck.peer.errors import SealError
from potluck.peer.seal.ledger import Ledger
from potluck.protocol.errors import WireError

logger = logging.getLogger(__name__)


async def send_seals(box: Mailbox, ledger: Ledger, rnd: Round) -> None:
    """Seal step ``rnd``'s messages and send each receiver its seal."""
    await deliver_seals(box, rnd, ledger.close(rnd))


async def deliver_seals(box: Mailbox, rnd: Round, seals: dict[str, bytes]) -> None:
    """Send each receiver its seal of step ``rnd`` (from ``Ledger.close``); a receiver that is gone is
    logged, not raised: it is the one that would need the seal."""
    tag = make_tag(Round(rnd.epoch, rnd.step), Stream.SEAL)
    failed = await asyncio.gather(*(box.send_quietly(peer, tag, seal) for peer, seal in seals.items()))
    for peer, why in zip(seals, failed, strict=True):
        if why is not None:
            logger.info("step %d: the step seal for %s did not go out: %s", rnd.step, peer, why)


async def exchange_seals(box: Mailbox, ledger: Ledger, rnd: Round, timeout_s: float) -> None:
    """Send this peer's step seals and check those of every peer it received from in step ``rnd``;
    ``SealError`` naming a sender whose seal is missing, malformed or does not match what it sent."""
    tag = make_tag(Round(rnd.epoch, rnd.step), Stream.SEAL)

    async def check(sender: str) -> None:
        try:
            data = await box.recv(sender, tag, timeout_s)
        except (TimeoutError, WireError) as e:
            raise SealError(sender, f"no step seal from {sender} for step {rnd.step}: {e}") from None
        ledger.accept(sender, rnd, data)

    await asyncio.gather(send_seals(box, ledger, rnd), *(check(s) for s in ledger.awaiting(rnd)))
