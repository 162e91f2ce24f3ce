"""Graceful leave: SIGTERM to a placed peer of a 2 x 2 job, each peer in its own directory.

The peer announces "leaving" at once but trains and serves its state on; the coordinator re-plans
without it while it is still running (the new epoch starts a few steps ahead of the swarm, and the old
plan's peers stop there together); the peer exits on its own once the new plan is under way, and no
committed step is lost. A second SIGTERM cuts the wait short."""

import signal
import subprocess
import time

import pytest

from potluck.testbed.faults import ENV as FAULTS
from potluck.testbed.faults import delay, encode
from potluck.testbed.harness.jobs import job_toml
from potluck.testbed.localswarm import LocalSwarm
from tests.helpers.logs import wait_for
from tests.helpers.swarm import (
    assert_goes_on_to_the_end,
    churn_swarm,
    committed_step,
    placed_at,
    start_on_own_disks,
)

pytestmark = [pytest.mark.integration, pytest.mark.extended, pytest.mark.timeout(420)]

STEPS = 250
PACE_S = 0.05  # seconds each peer sleeps per step (an injected delay, testbed/faults.py)
LEAVE_WITHIN_S = 90.0  # the peer's leave_timeout_s (60 s) plus its shutdown, on a loaded machine


def test_sigterm_hands_the_work_over_before_the_peer_exits_and_loses_no_step(tmp_path, monkeypatch):
    # Paced so the hand-off step lands well before the job's end: unpaced CPU steps (~0.04 s) put the
    # new plan's start (handoff_lead_s of steps ahead) at the last step, and the job ended before the
    # leaving peer saw its state taken over.
    monkeypatch.setenv(FAULTS, encode(delay(PACE_S)))
    job = tmp_path / "job.toml"
    job.write_text(
        job_toml("leave-test", steps=STEPS, ckpt=tmp_path / "owner-ckpt", interval=1000, stages=2, replicas=2)
    )
    with churn_swarm(tmp_path, job, "leave-test", step_timeout_s=10, verbose=1) as swarm:
        start_on_own_disks(swarm)
        log = swarm.procs["coordinator"].log
        wait_for(log, r"plan epoch 1: 2 stages x 2 replicas", 120)
        wait_for(log, r"step (1[5-9]|[2-9]\d)/", 120)
        name = placed_at(swarm, stage=1, replica=1)
        victim = swarm.procs[name]
        before = committed_step(swarm)

        victim.popen.send_signal(signal.SIGTERM)
        replanned_while_alive = False
        deadline = time.monotonic() + LEAVE_WITHIN_S
        while victim.alive() and time.monotonic() < deadline:
            replanned_while_alive |= "plan epoch 2:" in log.read_text(errors="replace")
            time.sleep(0.2)
        try:
            code = victim.popen.wait(timeout=1)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} did not leave in {LEAVE_WITHIN_S} s:\n{victim.tail(40)}") from None
        gone = victim.log.read_text(errors="replace")
        assert code == 0, gone[-3000:]
        assert replanned_while_alive, f"epoch 2 was not published before {name} exited:\n{gone[-3000:]}"
        assert "leaving: hand-off complete" in gone, gone[-3000:]

        assert_goes_on_to_the_end(swarm, STEPS, before, "leave", r"plan epoch 2: .*?from step (\d+)", 30, 300)


def test_a_second_sigterm_leaves_at_once_while_the_swarm_cannot_replan(tmp_path):
    """Two peers on a job of two stages: the coordinator cannot re-plan without the leaving peer, so
    it trains on and says why it waits; a second SIGTERM (Ctrl-C twice) ends the wait long before the
    60 s bound. (Below ``min_peers`` alone a running job re-plans on the peers it has, as long as they
    can run it: test_churn.py.)"""
    job = tmp_path / "job.toml"
    job.write_text(job_toml("leave-now", steps=5000, ckpt=tmp_path / "owner-ckpt", interval=1000, stages=2))
    peer_args = ("--probe-seconds", "0", "--threads", "1", "--device", "cpu", "--ttl", "15")
    with LocalSwarm(tmp_path / "run", job, swarm_id="leave-now", peer_args=peer_args) as swarm:
        swarm.start_coordinator()
        for name in ("a", "b"):
            swarm.start_peer(name, "--checkpoint-dir", str(tmp_path / "run" / name / "ckpt"))
        wait_for(swarm.procs["coordinator"].log, r"step ([5-9]|\d\d+)/", 120)
        leaver = swarm.procs["a"]
        leaver.popen.send_signal(signal.SIGTERM)
        wait_for(leaver.log, r"leaving: waiting for the coordinator to re-plan without this peer", 30)
        time.sleep(2.0)
        assert leaver.alive(), leaver.tail(40)  # still training and serving: nobody took over
        leaver.popen.send_signal(signal.SIGTERM)
        try:
            code = leaver.popen.wait(timeout=30)  # the hand-off wait alone would last 60 s
        except subprocess.TimeoutExpired:
            raise AssertionError(f"a second SIGTERM did not end the wait:\n{leaver.tail(40)}") from None
        assert code == 0, leaver.tail(40)
        assert "leaving now, without waiting for the hand-off" in leaver.log.read_text(errors="replace")
