"""Telemetry with real processes on loopback: peers and coordinator publish to a real mosquitto; a
SIGKILLed peer's last will says "offline"; the dashboard's API lists the swarm; the broker dying mid-run
does not stop training; `potluck demo` runs with the embedded broker (nothing installed), Chromium renders
its live dashboard, and `potluck monitor` shows it from MQTT and from the dashboard's API."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from potluck import lifeline
from potluck.protocol.telemetry import CoordinatorStatus, Event, PeerMetrics, PeerStatus
from potluck.testbed.harness.jobs import job_toml
from potluck.testbed.localswarm import LocalSwarm
from tests.helpers.logs import wait_for
from tests.helpers.mqtt import MOSQUITTO, collect, mosquitto
from tests.helpers.swarm import potluck_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PEER_ARGS = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu", "--telemetry-interval", "1")
ARTIFACTS = Path(__file__).resolve().parents[3] / "build" / "test-artifacts"


def _job(tmp: Path, steps: int) -> Path:
    job = tmp / "job.toml"
    job.write_text(
        job_toml("tel-test", steps=steps, ckpt=tmp / "ckpt", interval=10**6, n_layers=2, stages=2, replicas=1)
    )
    return job


def _by_peer(seen, kind):
    out: dict[str, list] = {}
    for _, m in seen:
        if isinstance(m, kind):
            out.setdefault(m.peer, []).append(m)
    return out


def _newest_step(log: Path, at_least: int, timeout_s: float) -> int:
    """The newest step the coordinator printed, once it is at least ``at_least``."""
    deadline = time.monotonic() + timeout_s
    while True:
        steps = [int(m) for m in re.findall(r"step (\d+)/\d+", log.read_text())]
        if steps and max(steps) >= at_least:
            return max(steps)
        assert time.monotonic() < deadline, (
            f"no step >= {at_least} within {timeout_s:.0f} s (saw {steps[-3:]})"
        )
        time.sleep(0.5)


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (scripts/test.sh installs it)")
def test_telemetry_over_mosquitto_survives_the_broker_and_a_killed_peer_goes_offline(tmp_path):
    """Telemetry arrives on the documented topics, verified; the dashboard lists the swarm; the broker
    dies mid-run and training goes on; a new broker on the same port gets the publishers back; a peer
    SIGKILLed then is announced "offline" by its last will."""
    from potluck.protocol.identity import Identity

    with LocalSwarm(
        tmp_path / "run", _job(tmp_path, 100_000), swarm_id="tel-mosq", peer_args=PEER_ARGS,
        coordinator_args=("--mqtt-url", "mqtt://127.0.0.1:{port}", "--dashboard-bind", "127.0.0.1:0"),
    ) as swarm, mosquitto(tmp_path) as (broker, port):  # fmt: skip
        swarm.coordinator_args = tuple(a.format(port=port) for a in swarm.coordinator_args)
        invite = swarm.start_coordinator()
        assert invite.mqtt == f"mqtt://127.0.0.1:{port}"  # the invite tells peers where to publish
        swarm.start_peer("a")
        swarm.start_peer("b")
        peers: set[str] = set()

        def training(seen) -> bool:
            status = _by_peer(seen, PeerStatus)
            metrics = _by_peer(seen, PeerMetrics)
            coord = [m for _, m in seen if isinstance(m, CoordinatorStatus) and m.stages]
            contributing = {p for p, ms in status.items() if ms[-1].state == "contributing"}
            peers.update(contributing)
            counted = {p for p, ms in metrics.items() if ms[-1].step > 0 and ms[-1].tokens_contributed > 0}
            return len(contributing) >= 2 and len(counted) >= 2 and bool(coord)

        seen = asyncio.run(collect("127.0.0.1", port, "tel-mosq", invite.coordinator_key, training, 150))
        assert not [m for _, m in seen if isinstance(m, Exception)], "every message verified"
        metrics = _by_peer(seen, PeerMetrics)
        assert all(ms[-1].step > 0 and ms[-1].tokens_contributed > 0 for ms in metrics.values())
        kinds = {m.kind for _, m in seen if isinstance(m, Event)}
        assert {"joined", "placed"} <= kinds, kinds
        coord = [m for _, m in seen if isinstance(m, CoordinatorStatus)][-1]
        assert set(coord.members) >= peers and sum(len(s.peers) for s in coord.stages) == 2

        log = swarm.procs["coordinator"].log
        url = wait_for(log, r"dashboard: (http://\S+)", 30).group(1)
        state = _get_json(url + "api/v1/state")
        assert {p["id"] for p in state["peers"]} >= peers
        assert state["plan"]["epoch"] >= 1 and len(state["plan"]["stages"]) == 2
        with urllib.request.urlopen(url + "metrics", timeout=10) as r:
            assert b"potluck_job_step" in r.read()

        # The broker dies mid-run: training goes on (30 more steps), nobody crashes.
        broker.kill()
        broker.wait(timeout=10)
        at = _newest_step(log, 0, 30)
        assert _newest_step(log, at + 30, 60) >= at + 30

        with mosquitto(tmp_path, port) as _:  # a new broker on the same port: the publishers come back
            victim = Identity.load(swarm.root / "b" / "identity.pem").peer_id

            def back(seen) -> bool:
                return {m.peer for _, m in seen if isinstance(m, PeerMetrics)} >= peers

            asyncio.run(collect("127.0.0.1", port, "tel-mosq", invite.coordinator_key, back, 60))
            swarm.stop("b", signal.SIGKILL)

            def offline(seen) -> bool:
                return any(
                    isinstance(m, PeerStatus) and m.peer == victim and m.state == "offline" for _, m in seen
                )

            seen = asyncio.run(collect("127.0.0.1", port, "tel-mosq", invite.coordinator_key, offline, 60))
        will = next(
            m for _, m in seen if isinstance(m, PeerStatus) and m.peer == victim and m.state == "offline"
        )
        assert will.message == "connection lost"  # the broker's last will, not a goodbye
        for name in ("a", "b"):
            assert "Traceback" not in swarm.procs[name].log.read_text()


@pytest.mark.skipif(
    shutil.which("chromium") is None and not Path("/usr/bin/chromium").exists(), reason="no chromium"
)
@pytest.mark.extended  # full tier only (docs/development.md, Tests)
def test_the_demo_needs_nothing_installed_and_chromium_renders_its_live_dashboard(tmp_path):
    import subprocess
    import sys

    from tests.helpers.browser import open_page

    run = tmp_path / "demo"
    out = open(tmp_path / "demo.out", "wb")  # noqa: SIM115
    demo = subprocess.Popen(
        [sys.executable, "-m", "potluck", "demo", "--steps", "100000", "--run-dir", str(run)],
        stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=lifeline.preexec(signal.SIGKILL),  # dies with the test run, even a killed one
    )  # fmt: skip
    try:
        # The demo runs the embedded broker: nothing installed, its URL in the invite the demo writes.
        url = wait_for(tmp_path / "demo.out", r"dashboard: (http://\S+)", 120).group(1)
        port = int(wait_for(tmp_path / "demo.out", r"mqtt: mqtt://127\.0\.0\.1:(\d+)", 5).group(1))
        from potluck.protocol.invite import read_invite

        invite = read_invite(f"@{run / 'invite.txt'}")
        assert invite.mqtt == f"mqtt://127.0.0.1:{port}"

        def contributing(seen) -> bool:
            status = _by_peer(seen, PeerStatus)
            return sum(1 for ms in status.values() if ms[-1].state == "contributing") == 4

        seen = asyncio.run(collect("127.0.0.1", port, "demo", invite.coordinator_key, contributing, 150))
        assert any(isinstance(x, CoordinatorStatus) for _, x in seen)
        assert not [m for _, m in seen if isinstance(m, Exception)], "every message verified"

        async def look() -> None:
            async with open_page(url) as page:
                await page.wait_until(
                    "Number(document.querySelector('#loss-chart').dataset.points) >= 3"
                    " && document.querySelectorAll('#stage-table td.peer[data-state=contributing]').length == 4"
                    " && document.querySelectorAll('#loss-chart canvas').length > 0",
                    200,
                )
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                await page.screenshot(ARTIFACTS / "dashboard.png")
                rows = await page.evaluate("document.querySelectorAll('#peer-table tbody tr').length")
                assert rows == 4

        asyncio.run(look())
        assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000
        # The terminal view, from MQTT alone (the invite names the broker and the coordinator's key) ...
        got = potluck_cli(
            "monitor", "--join", f"@{run / 'invite.txt'}", "--once", "--json", "--wait", "20", timeout=60
        )
        assert got.returncode == 0, got.stderr
        snap = json.loads(got.stdout)
        assert (
            snap["job"]["name"] == "demo" and len(snap["peers"]) == 4 and snap["telemetry"]["rejected"] == 0
        )
        # ... and from the dashboard's API.
        got = potluck_cli("monitor", url, "--once", timeout=60)
        assert got.returncode == 0, got.stderr
        assert "plan epoch" in got.stdout and "contributing" in got.stdout
    finally:
        import os

        os.killpg(demo.pid, signal.SIGTERM)
        try:
            demo.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(timeout=10)
        out.close()
