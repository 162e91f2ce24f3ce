"""A real mosquitto on a free loopback port for a test (started and killed by PID), and a subscriber that
collects a swarm's verified telemetry until a condition holds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiomqtt

from potluck import lifeline
from potluck.protocol.errors import RecordError
from potluck.protocol.telemetry import open_message, swarm_filter

MOSQUITTO = next((p for p in ("/usr/sbin/mosquitto", "/usr/bin/mosquitto") if os.path.exists(p)), None)
MOSQUITTO = MOSQUITTO or shutil.which("mosquitto")


@contextlib.contextmanager
def mosquitto(tmp: Path, port: int | None = None) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """mosquitto on ``port`` (None: a free one) of 127.0.0.1, killed by PID on exit."""
    assert MOSQUITTO is not None, "mosquitto is not installed (scripts/test.sh installs it)"
    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
    conf = tmp / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_packet_size 1048576\n"
    )
    log = open(tmp / "mosquitto.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [MOSQUITTO, "-c", str(conf)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lifeline.preexec(signal.SIGKILL),  # dies with the test run, even a killed one
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mosquitto did not start: {(tmp / 'mosquitto.log').read_text()}")
            time.sleep(0.1)
        yield proc, port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        log.close()


Seen = list[tuple[str, object]]  # (topic, verified message)


async def collect(
    host: str, port: int, swarm: str, coordinator_key: bytes, until: Callable[[Seen], bool], timeout_s: float
) -> Seen:
    """Subscribe to the swarm's topics; return the verified messages once ``until(seen)`` holds."""
    seen: Seen = []

    async def run() -> None:
        async with aiomqtt.Client(
            host, port, identifier=f"test-{os.getpid()}-{time.monotonic_ns()}"
        ) as client:
            await client.subscribe(swarm_filter(swarm), qos=1)
            async for m in client.messages:
                try:
                    seen.append(
                        (str(m.topic), open_message(str(m.topic), bytes(m.payload), swarm, coordinator_key))
                    )
                except RecordError as e:
                    seen.append((str(m.topic), e))
                if until(seen):
                    return

    try:
        await asyncio.wait_for(run(), timeout_s)
    except TimeoutError:
        kinds = sorted({t.split("/", 2)[2] for t, _ in seen})
        raise AssertionError(
            f"telemetry never satisfied the test within {timeout_s:.0f} s; saw {kinds}"
        ) from None
    return seen
