"""``potluck monitor``: the dashboard's overview in a terminal, for headless boxes.

With ``--join INVITE`` it reads the swarm's telemetry straight from its MQTT broker (the invite names it)
and never asks the coordinator: every message is verified (peers' signatures, the coordinator's key from
the invite) exactly as the dashboard does. With a dashboard URL it polls ``/api/v1/state`` instead.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import typer
from rich.console import Console
from rich.live import Live

from potluck.cli.common import err_console, fail, parse_invite
from potluck.cli.views.monitor import frame

MAX_STATE_BYTES = 16 << 20  # a dashboard's JSON for a few thousand peers


def monitor(
    url: str = typer.Argument(None, help="A dashboard URL (http://HOST:PORT/) instead of --join."),
    join: str = typer.Option(None, "--join", help="The swarm's invite (or @FILE): read its MQTT broker."),
    mqtt_url: str = typer.Option(None, "--mqtt-url", help="Read this broker instead of the invite's."),
    mqtt_ca: str = typer.Option(None, "--mqtt-ca", help="CA bundle to check an mqtts:// broker against."),
    once: bool = typer.Option(False, "--once", help="Print one frame (after --wait) and exit."),
    as_json: bool = typer.Option(False, "--json", help="With --once: print the snapshot as JSON."),
    wait: float = typer.Option(10.0, min=0.0, help="With --once: seconds to gather messages first."),
    refresh: float = typer.Option(1.0, min=0.2, help="Seconds between two frames."),
) -> None:
    """Watch a swarm live in the terminal: peers, plan, step-time breakdown, events."""
    if (url is None) == (join is None):
        raise fail("give either a dashboard URL or --join INVITE")
    if url is not None:
        read = _poller(url)
        source = f"dashboard {url}"
    else:
        read, source = _mqtt_reader(join, mqtt_url, mqtt_ca)
    asyncio.run(_watch(read, source, once, as_json, wait, refresh))


def _poller(url: str) -> Any:
    base = url if url.endswith("/") else url + "/"
    if not base.startswith(("http://", "https://")):
        raise fail(f"{url!r} is not an http:// dashboard URL")

    def fetch() -> dict[str, Any]:
        with urllib.request.urlopen(base + "api/v1/state", timeout=10) as r:
            doc: dict[str, Any] = json.loads(r.read(MAX_STATE_BYTES))
            return doc

    async def read() -> dict[str, Any]:
        return await asyncio.to_thread(fetch)

    return read


def _mqtt_reader(join: str, mqtt_url: str | None, mqtt_ca: str | None) -> tuple[Any, str]:
    from potluck.telemetry.aggregate import SwarmView
    from potluck.telemetry.config import MqttTarget
    from potluck.telemetry.errors import TelemetryError
    from potluck.telemetry.subscriber import Subscriber

    invite = parse_invite(join)
    if not (mqtt_url or invite.mqtt):
        raise fail("the invite names no telemetry broker; give --mqtt-url")
    try:
        target = MqttTarget.parse(mqtt_url or invite.mqtt or "", mqtt_ca)
    except TelemetryError as e:
        raise fail(str(e)) from None
    view = SwarmView(invite.swarm_id, invite.coordinator_key)
    subscriber = Subscriber(target, view)
    started: list[asyncio.Task[None]] = []

    async def read() -> dict[str, Any]:
        if not started:
            started.append(asyncio.create_task(subscriber.run(), name="mqtt-subscriber"))
        return view.snapshot(time.time())

    return read, f"MQTT {target.url(with_password=False)}"


async def _watch(read: Any, source: str, once: bool, as_json: bool, wait: float, refresh: float) -> None:
    console = Console(markup=False)  # peers' addresses and messages are printed as they are
    try:
        if once:
            snap = await read()
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and snap.get("job") is None:
                await asyncio.sleep(0.5)
                snap = await read()
            await asyncio.sleep(min(1.0, wait))  # the rest of the retained burst (every peer's status)
            snap = await read()
            if as_json:
                typer.echo(json.dumps(snap))
            else:
                console.print(frame(snap, source))
            return
        with Live(console=console, refresh_per_second=4, screen=False) as live:
            while True:
                try:
                    live.update(frame(await read(), source))
                except OSError as e:
                    err_console.print(f"cannot read {source}: {e}", highlight=False)
                await asyncio.sleep(refresh)
    except OSError as e:
        raise fail(f"cannot read {source}: {e}") from None
    finally:
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()


def register(app: typer.Typer) -> None:
    app.command("monitor")(monitor)
