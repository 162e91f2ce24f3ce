"""Durable checkpoints without a shared disk: every peer keeps its own, the job owner pulls a copy.

Each peer runs in its own state directory (``--state-dir``), as on a machine of its own. A stage's
checkpoint is written by each of its replicas to its own disk; the coordinator pulls every complete
checkpoint into the job's ``checkpoint.dir`` and serves it. When a stage loses every replica, the swarm
resumes from the newest complete checkpoint and the stage's new peer fetches its layers over P2P."""

import re
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from potluck.protocol.checkpoints import check_step, latest_complete, step_dir, weights_path
from potluck.protocol.identity import Identity
from potluck.testbed.faults import ENV as FAULTS
from potluck.testbed.faults import delay, encode
from potluck.testbed.harness.jobs import job_toml
from potluck.testbed.localswarm import LocalSwarm
from tests.helpers.logs import launch_summary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

PEER_ARGS = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu", "--ttl", "15")
PEER_ARGS += ("--step-timeout", "5")
PACE_S = 0.1  # seconds each peer sleeps per step (an injected delay, testbed/faults.py)


def _wait(what: str, check, timeout_s: float, log: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.3)
    raise AssertionError(f"{what} not seen in {timeout_s} s:\n{log.read_text(errors='replace')[-3000:]}")


def _stage_peers(text: str, stage: int) -> list[str]:
    """The 12-character peer id prefixes of ``stage`` in the last plan table of the launch output."""
    rows = re.findall(rf"│ {stage} +│ [0-9-]+ +│ ([\w, ]+?) +│", text)
    assert rows, text[-3000:]
    return re.findall(r"\w{12}", rows[-1])


def _same_tensors(a: Path, b: Path) -> bool:
    ta, tb = load_file(str(a)), load_file(str(b))
    return ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


@pytest.mark.extended  # full tier only (docs/development.md, Tests)
def test_losing_every_replica_of_a_stage_resumes_from_the_owners_copy(tmp_path, monkeypatch):
    # Paced (inherited by the peers): unpaced, this model runs 60 steps in a few seconds, and a peer may
    # prune step 10 (keep = 3) before the test compares it with the owner's copy, or finish before the kill.
    monkeypatch.setenv(FAULTS, encode(delay(PACE_S)))
    steps, owner = 60, tmp_path / "owner-ckpt"
    job = tmp_path / "job.toml"
    job.write_text(job_toml("copies", steps=steps, ckpt=owner, interval=10, stages=2, replicas=2))
    run = tmp_path / "run"
    with LocalSwarm(
        run, job, swarm_id="copies", peer_args=PEER_ARGS, coordinator_args=("--json",), verbose=1
    ) as swarm:
        swarm.start_coordinator()
        names = ("a", "b", "c", "d")
        for name in names:
            swarm.start_peer(name)
        log = swarm.procs["coordinator"].log
        _wait("plan epoch 1", lambda: "plan epoch 1: 2 stages x 2 replicas" in log.read_text(), 120, log)
        ids = {n: Identity.load(run / n / "identity.pem").peer_id for n in names}

        # The owner's copy of a complete checkpoint arrives while the job runs.
        copied = _wait("a copy in the owner's dir", lambda: latest_complete(owner), 150, log)
        assert copied.step >= 10 and copied.step % 10 == 0

        # Every replica wrote its own stage to its own disk, nothing else; the copy equals them.
        text = log.read_text(errors="replace")
        for stage in (0, 1):
            for prefix in _stage_peers(text, stage):
                name = next(n for n, pid in ids.items() if pid.startswith(prefix))
                own = step_dir(run / name / "checkpoints" / "copies", copied.step)
                assert sorted(p.name for p in own.glob("stage-*.json")) == [f"stage-{stage:03d}.json"]
                assert _same_tensors(weights_path(own, stage), weights_path(copied.path, stage))

        # Both replicas of stage 1 die: stage 1's layers now exist only in checkpoints.
        victims = [n for n, pid in ids.items() if pid[:12] in _stage_peers(text, 1)]
        assert len(victims) == 2
        for name in victims:
            swarm.stop(name, signal.SIGKILL)

        # A first re-plan may still count on a victim whose heartbeat has not expired and that nobody has named yet; its peers then fail to reach
        # it for the state, name it, and the next plan resumes from the newest complete checkpoint.
        pattern = r"resume at step (\d+): (?:complete checkpoint|every stage reported a checkpoint)"
        resumed = _wait("a resume from a checkpoint", lambda: re.search(pattern, log.read_text()), 150, log)
        start = int(resumed.group(1))
        assert start >= copied.step and start % 10 == 0, f"resumed at {start}, copy at {copied.step}"

        coordinator = swarm.procs["coordinator"]
        coordinator.popen.wait(timeout=300)  # launch ends by itself at the job's last step
        text = log.read_text(errors="replace")
        assert coordinator.popen.returncode == 0, text[-3000:]
        summary = launch_summary(text)
        assert summary["steps"] == steps
        # The final checkpoint is complete in the owner's directory.
        assert check_step(step_dir(owner, steps)).n_stages >= 1
        # Stage 1's new peer took its layers from a holder over the swarm, not from its own disk.
        survivors = [n for n in names if n not in victims]
        took = [
            re.search(r"resumed at step \d+ from peers:", (run / f"{n}.log").read_text()) for n in survivors
        ]
        assert any(took), [(run / f"{n}.log").read_text()[-2000:] for n in survivors]


def test_a_one_replica_stage_resumes_from_the_copy_a_live_peer_keeps(tmp_path):
    """No owner's copy (``--no-checkpoint-copy``): stage 1 has one replica, so the plan names stage 0's
    peer to keep a copy of its checkpoints. Stage 1's peer dies; the spare takes its layers from that
    copy, over the swarm."""
    steps, owner = 40, tmp_path / "owner-ckpt"
    job = tmp_path / "job.toml"
    job.write_text(job_toml("keep", steps=steps, ckpt=owner, interval=10, stages=2, max_replicas=1))
    run = tmp_path / "run"
    with LocalSwarm(
        run,
        job,
        swarm_id="keep",
        peer_args=PEER_ARGS,
        coordinator_args=("--json", "--no-checkpoint-copy"),
        verbose=1,
    ) as swarm:
        swarm.start_coordinator()
        names = ("a", "b", "c")
        for name in names:
            swarm.start_peer(name)
        log = swarm.procs["coordinator"].log
        _wait("plan epoch 1", lambda: "plan epoch 1: 2 stages x 1 replicas" in log.read_text(), 120, log)
        ids = {n: Identity.load(run / n / "identity.pem").peer_id for n in names}
        text = log.read_text(errors="replace")
        first = next(n for n, pid in ids.items() if pid[:12] in _stage_peers(text, 0))
        second = next(n for n, pid in ids.items() if pid[:12] in _stage_peers(text, 1))

        def kept() -> int:  # the newest step of stage 1 that stage 0's peer keeps a copy of
            root = run / first / "checkpoints" / "keep"
            found = [int(p.parent.name[5:]) for p in root.glob("step-*/stage-001.json")]
            return max(found, default=0)

        copy_step = _wait("a copy of stage 1 on stage 0's peer", kept, 150, log)
        swarm.stop(second, signal.SIGKILL)

        # The first re-plan may come from the victim's expired heartbeat before stage 0's peer reported
        # the copy (its own step fails seconds later); the resume itself must come from that copy.
        pattern = r"resume at step (\d+): (?:complete checkpoint|every stage reported a checkpoint)"
        resumed = _wait("a resume from a checkpoint", lambda: re.search(pattern, log.read_text()), 120, log)
        assert int(resumed.group(1)) >= copy_step
        coordinator = swarm.procs["coordinator"]
        coordinator.popen.wait(timeout=300)
        text = log.read_text(errors="replace")
        assert coordinator.popen.returncode == 0, text[-3000:]
        summary = launch_summary(text)
        assert summary["steps"] == steps
        assert not owner.exists() or not any(owner.iterdir())  # nothing came through the owner's copy
        spare = next(n for n in names if n not in (first, second))
        spare_log = (run / f"{spare}.log").read_text()
        assert re.search(r"resumed at step \d+ from peers:", spare_log), spare_log[-3000:]
