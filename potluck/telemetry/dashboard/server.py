"""The dashboard's web server: the page, its assets, the JSON API, live updates and ``/metrics``.

Routes (all GET): ``/`` the page; ``/static/...`` its assets, served from the package (no CDN, so it
works on a swarm with no internet); ``/api/v1/state`` the ``SwarmView`` snapshot as JSON;
``/api/v1/stream`` the same snapshot every ``refresh_s`` as server-sent events (the page's live
updates); ``/metrics`` Prometheus text; ``/healthz``. Binds loopback by default: the dashboard shows who
is in the swarm, so exposing it is the owner's choice (``--dashboard-bind``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from potluck.telemetry.aggregate import SwarmView
from potluck.telemetry.http import PROMETHEUS_TYPE, start_site, stop_site
from potluck.telemetry.prometheus import swarm_metrics_text

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

STATIC = Path(__file__).parent / "static"
MAX_STREAMS = 32  # live pages at once; more get 503 (each costs a JSON dump per refresh)
HEADERS = {
    # Everything comes from this server: no CDN, no inline script, nothing framed elsewhere.
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


class Dashboard:
    def __init__(
        self, view: SwarmView, host: str = "127.0.0.1", port: int = 0, refresh_s: float = 2.0
    ) -> None:
        self.view, self.host, self.port, self.refresh_s = view, host, port, refresh_s
        self._runner: web.AppRunner | None = None
        self._streams = 0

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/"

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_headers])
        app.router.add_get("/", self._index)
        app.router.add_get("/api/v1/state", self._state)
        app.router.add_get("/api/v1/stream", self._stream)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._health)
        app.router.add_static("/static/", STATIC, follow_symlinks=False, show_index=False)
        return app

    async def start(self) -> str:
        self._runner, self.port = await start_site(self.app(), self.host, self.port)
        logger.info("dashboard on %s", self.url)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await stop_site(runner)

    def _snapshot(self) -> bytes:
        return json.dumps(self.view.snapshot(time.time()), allow_nan=False, default=str).encode()

    async def _index(self, _: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html")

    async def _state(self, _: web.Request) -> web.Response:
        return web.Response(body=self._snapshot(), content_type="application/json")

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(
            body=swarm_metrics_text(self.view, time.time()), headers={"Content-Type": PROMETHEUS_TYPE}
        )

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        if self._streams >= MAX_STREAMS:
            raise web.HTTPServiceUnavailable(text="too many live dashboards open\n")
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
        )
        await response.prepare(request)
        self._streams += 1
        try:
            while True:
                await asyncio.wait_for(response.write(b"data: " + self._snapshot() + b"\n\n"), 10.0)
                await asyncio.sleep(self.refresh_s)
        except (ConnectionError, TimeoutError):
            pass  # the page went away
        finally:
            self._streams -= 1
        return response


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    for key, value in HEADERS.items():
        response.headers.setdefault(key, value)
    return response
