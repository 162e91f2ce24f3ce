"""No orphans: whatever kills potluck, nothing it started runs on.

`potluck demo` is SIGKILLed mid-run (as the OOM killer or a closed container would); its peer
processes and every p2pd daemon (the demo's own and each peer's) must be gone within 10 s. And a peer
whose swarm is gone says so and leaves instead of running on alone.
"""

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from potluck import lifeline
from potluck.net.config import NetworkConfig
from potluck.net.node import SwarmNode
from potluck.peer.config import PeerConfig
from potluck.peer.daemon import PeerDaemon
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.identity import Identity
from potluck.testbed.faults import as_env, kill_at
from potluck.testbed.harness.jobs import job_toml
from potluck.testbed.localswarm import LOOPBACK, LocalSwarm
from tests.helpers.swarm import TINY_JOB, ProcInfo, descendants, kill_recorded, still_running

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="walks /proc"),
]

PEERS = 4  # the demo's 2 stages x 2 replicas
GONE_WITHIN_S = 10.0


def _wait_for_swarm(demo: subprocess.Popen[bytes], timeout_s: float) -> list[ProcInfo]:
    """Every process below the demo once it runs 4 peers and 5 p2pd daemons (its own and theirs)."""
    deadline = time.monotonic() + timeout_s
    while True:
        procs = descendants(demo.pid)
        daemons = [p for p in procs if p.comm == "p2pd"]
        peers = [p for p in procs if p.ppid == demo.pid and p.comm != "p2pd"]
        if len(daemons) >= PEERS + 1 and len(peers) >= PEERS:
            return procs
        assert demo.poll() is None, f"the demo exited early with {demo.returncode}"
        assert time.monotonic() < deadline, f"no full swarm within {timeout_s:.0f} s: {procs}"
        time.sleep(0.5)


@pytest.mark.extended  # full tier only (docs/development.md, Tests)
def test_sigkilled_demo_leaves_no_process_behind(tmp_path):
    with open(tmp_path / "demo.err", "wb") as err:
        demo = subprocess.Popen(
            [sys.executable, "-m", "potluck", "demo", "--steps", "40", "--run-dir", str(tmp_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,  # its own group, so the test's own group is never signalled
        )
    recorded: list[ProcInfo] = []
    try:
        recorded = _wait_for_swarm(demo, timeout_s=120)
        # Mid-run: the first checkpoint (step 10 of 40) is written while training goes on.
        deadline = time.monotonic() + 180
        while not any((tmp_path / "checkpoints").rglob("*.safetensors")):
            assert demo.poll() is None, f"the demo exited early with {demo.returncode}"
            assert time.monotonic() < deadline, "no checkpoint within 180 s"
            time.sleep(0.5)
        recorded = list({p.pid: p for p in recorded + descendants(demo.pid)}.values())
        os.kill(demo.pid, signal.SIGKILL)  # only the demo, by PID
        demo.wait(timeout=5)
        start = time.monotonic()
        while any(still_running(p) for p in recorded) and time.monotonic() - start < GONE_WITHIN_S:
            time.sleep(0.1)
        left = [p for p in recorded if still_running(p)]
        assert not left, f"still running {GONE_WITHIN_S:.0f} s after the demo was SIGKILLed: {left}"
    finally:
        if demo.poll() is None:
            recorded += descendants(demo.pid)
            demo.kill()
            demo.wait(timeout=5)
        kill_recorded(recorded)


def test_peer_leaves_when_its_swarm_is_gone(tmp_path, caplog):
    """Coordinator SIGKILLed: the lone peer logs one WARNING and leaves after swarm_gone_after_s."""
    limit_s = 3.0
    swarm = LocalSwarm(tmp_path, TINY_JOB, swarm_id="gone", coordinator_args=("--membership-only",))
    with swarm:
        invite = swarm.start_coordinator()
        cfg = PeerConfig(
            invite=invite,
            identity_path=tmp_path / "peer" / "identity.pem",
            net=NetworkConfig(host_maddrs=(LOOPBACK,), bootstrap_timeout_s=30.0),
            probe_budget_s=0.05,
            train=False,
            swarm_gone_after_s=limit_s,
        )

        async def main() -> tuple[bool, float]:
            daemon = PeerDaemon(cfg)
            task = asyncio.create_task(daemon.run())
            await asyncio.wait_for(daemon.ready.wait(), 60)
            await asyncio.sleep(2 * limit_s)  # the coordinator is there: the peer stays
            assert not task.done() and not daemon.swarm_gone
            killed = time.monotonic()
            await asyncio.to_thread(swarm.stop, "coordinator", signal.SIGKILL)
            await asyncio.wait_for(task, limit_s + 20)
            return daemon.swarm_gone, time.monotonic() - killed

        with caplog.at_level(logging.WARNING, logger="potluck.peer.daemon"):
            gone, after_s = asyncio.run(main())
    assert gone
    # "Last seen" may be up to one poll (limit_s / 4) plus one bounded check (1 s) before the kill; then
    # a bounded leave follows.
    assert limit_s / 2 <= after_s < limit_s + 15, after_s
    warnings = [r for r in caplog.records if "is gone" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


@pytest.mark.skipif(not lifeline.PDEATHSIG_AVAILABLE, reason="PR_SET_PDEATHSIG is Linux only")
def test_p2pd_is_spawned_through_the_pdeathsig_hook(caplog):
    """hivemind spawns p2pd through our hook, so no watchdog fallback was needed."""

    async def main() -> None:
        me = Identity.generate()
        node = await SwarmNode.start(
            me, TrustPolicy("hook", me.public_key), NetworkConfig(host_maddrs=(LOOPBACK,))
        )
        try:
            assert node.p2p._child is not None and node.p2p._child.returncode is None
        finally:
            await node.shutdown()

    watchdogs = len(lifeline._watchdogs)
    with caplog.at_level(logging.WARNING, logger="potluck.net.node"):
        asyncio.run(main())
    assert len(lifeline._watchdogs) == watchdogs, "p2pd fell back to a watchdog: the hook did not run"
    assert not [r for r in caplog.records if "hook" in r.getMessage()]


def test_a_peer_killed_by_an_injected_fault_at_a_step_takes_its_p2pd_with_it(tmp_path):
    """``testbed.faults.kill_at``: the peer SIGKILLs itself right after committing the step, as a crash
    there would, and its p2pd follows it (lifeline)."""
    job = tmp_path / "job.toml"
    job.write_text(job_toml("fault-kill", steps=400, ckpt=tmp_path / "ckpt", interval=1000, replicas=2))
    peer_args = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu", "--step-timeout", "5")
    with LocalSwarm(tmp_path / "run", job, swarm_id="fault-kill", peer_args=peer_args) as swarm:
        swarm.start_coordinator()
        swarm.start_peer("steady")
        victim = swarm.start_peer("victim", env=as_env(kill_at(3)))
        daemons: list[ProcInfo] = []
        deadline = time.monotonic() + 120
        while not daemons and victim.alive():  # its p2pd, recorded while the peer still runs
            daemons = [p for p in descendants(victim.pid) if p.comm == "p2pd"]
            assert time.monotonic() < deadline, victim.tail()
            time.sleep(0.2)
        assert daemons, f"the victim exited before its p2pd could be seen: {victim.tail()}"
        victim.popen.wait(timeout=120)
        assert victim.popen.returncode == -signal.SIGKILL, victim.tail()
        assert "committed step 3: killing this process (an injected fault)" in victim.log.read_text()
        gone_by = time.monotonic() + GONE_WITHIN_S
        while any(still_running(p) for p in daemons) and time.monotonic() < gone_by:
            time.sleep(0.2)
        left = [p for p in daemons if still_running(p)]
        kill_recorded(left)
        assert not left, f"the victim's p2pd outlived it: {left}"
