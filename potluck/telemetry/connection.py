"""One broker connection: the client both publisher and subscriber open, and the loop that keeps one up.

``keep_connected`` runs a session until it fails, then waits with exponential backoff (jittered, so a
restarted broker is not stormed by every peer at once) and runs it again; the backoff starts over after
a session that did connect. An outage is logged once, not at every retry.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

import aiomqtt

from potluck.telemetry.config import MqttTarget, PublisherConfig

logger = logging.getLogger(__name__)

ERRORS = (aiomqtt.MqttError, OSError, TimeoutError)


def client(
    target: MqttTarget,
    client_id: str,
    cfg: PublisherConfig,
    will: aiomqtt.Will | None = None,
    timeout_s: float | None = None,
) -> aiomqtt.Client:
    return aiomqtt.Client(
        target.host,
        target.port,
        username=target.username,
        password=target.password,
        identifier=client_id,
        will=will,
        keepalive=cfg.keepalive_s,
        timeout=cfg.connect_timeout_s if timeout_s is None else timeout_s,
        tls_context=target.tls_context(),
    )


async def keep_connected(
    session: Callable[[], Awaitable[None]],
    target: MqttTarget,
    cfg: PublisherConfig,
    sessions: Callable[[], int],
    what: str,
) -> None:
    """Run ``session`` again and again until cancelled; ``sessions()`` counts the ones that connected."""
    backoff, told = cfg.first_backoff_s, False
    while True:
        before = sessions()
        try:
            await session()
        except ERRORS as e:
            (logger.debug if told else logger.info)(
                "%s: broker %s unavailable (%s); retrying with backoff", what, target.url(False), e
            )
            told = True
        if sessions() > before:  # it was up: a fresh outage starts from the first backoff
            backoff, told = cfg.first_backoff_s, False
        await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
        backoff = min(cfg.max_backoff_s, backoff * 2)
