"""Who may take part, kept in the DHT: the swarm's ban list and the join tokens' use counts.

The coordinator merges the ban list it reads (``potluck ban`` may have added to it) with its own and
keeps its own published: peers refuse banned peers' records from their next read of it. It keeps the
tokens' uses published too, and reads them back before it admits anyone after a restart, so that no
count lives only on the coordinator's disk or in its memory (``admit.py`` decides with them)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from hivemind.utils import get_dht_time

from potluck.aio import bounded
from potluck.coordinator.admit import AdmissionDesk
from potluck.coordinator.config import CoordinatorConfig
from potluck.net.node import SwarmNode
from potluck.protocol.admission import MAX_BANS, BanList, TokenUses
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.keys import BANS, TOKENS

logger = logging.getLogger(__name__)


async def restore_token_uses(node: SwarmNode, desk: AdmissionDesk, read_timeout_s: float) -> None:
    """Before admitting anyone: count on from the token uses an earlier run of ours published."""
    try:
        found = await bounded(node.fetch(TOKENS.name), read_timeout_s, "reading token uses")
    except Exception as e:  # a first start, or an unreadable DHT: count from here
        logger.warning("token uses not read (%s); counting from zero", e)
        return
    for v in found:
        if isinstance(v.record, TokenUses):
            desk.restore(v.record, get_dht_time())


async def keep_access(
    node: SwarmNode,
    desk: AdmissionDesk,
    policy: TrustPolicy,
    cfg: CoordinatorConfig,
    ban: Callable[[str, str], None],
) -> None:
    """Each poll: take in the bans read from the DHT (``ban(peer, why)``), republish ours when it
    changed or a third of its TTL passed, and the token uses likewise. Runs until cancelled."""
    published: frozenset[str] = frozenset()
    refreshed = tokens_at = 0.0  # monotonic times of the last publications
    uses_published = 0  # the desk's version last published
    while True:
        try:
            due = time.monotonic() - tokens_at > cfg.bans_ttl_s / 3
            version = desk.version
            if desk.expires and (version != uses_published or due):
                uses = desk.record(get_dht_time())
                if await node.publish(TOKENS.name, uses, cfg.bans_ttl_s):
                    uses_published, tokens_at = version, time.monotonic()
            for peer in await node.read_bans() - policy.banned:
                ban(peer, "on the swarm's ban list")
            due = time.monotonic() - refreshed > cfg.bans_ttl_s / 3
            if policy.banned and (published != policy.banned or due):
                bans = BanList(peers=sorted(policy.banned)[-MAX_BANS:], issued_at=get_dht_time())
                if await node.publish(BANS.name, bans, cfg.bans_ttl_s):
                    published, refreshed = frozenset(policy.banned), time.monotonic()
        except Exception:
            logger.exception("keeping the ban list and token uses failed")
        await asyncio.sleep(cfg.poll_interval_s)
