"""HTTP endpoints over aiohttp: a process's ``/metrics`` (a peer's ``--metrics-port``), and the runner the
dashboard uses. Servers bind where they are told (loopback by default) and stop within a bound."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiohttp import web

from potluck.telemetry.errors import TelemetryError

logger = logging.getLogger(__name__)

PROMETHEUS_TYPE = "text/plain; version=0.0.4"
STOP_TIMEOUT_S = 3.0


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port`` (0: a free port); returns the runner and the bound port."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, shutdown_timeout=1.0)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise TelemetryError(f"cannot serve HTTP on {host}:{port}: {e.strerror or e}") from None
    addresses = runner.addresses  # (host, port, ...) of each bound socket: the chosen port when 0
    bound = int(addresses[0][1]) if addresses else port
    return runner, bound


async def stop_site(runner: web.AppRunner) -> None:
    try:
        await asyncio.wait_for(runner.cleanup(), STOP_TIMEOUT_S)
    except (TimeoutError, Exception) as e:
        logger.info("HTTP server stop: %s", e)


async def serve_metrics(host: str, port: int, render: Callable[[], bytes]) -> None:
    """Serve ``GET /metrics`` (``render()``'s Prometheus text) until cancelled."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=render(), headers={"Content-Type": PROMETHEUS_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner, bound = await start_site(app, host, port)
    logger.info("serving /metrics on http://%s:%d/metrics", host, bound)
    try:
        await asyncio.Event().wait()
    finally:
        await stop_site(runner)
