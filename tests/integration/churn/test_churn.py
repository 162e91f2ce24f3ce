"""Churn on separate machines: each peer in its own directory, a peer killed by PID mid-run.

When every stage keeps a live replica, the new plan epoch starts from the step the survivors hold in
memory, not from a checkpoint: the only work lost is the step in flight. No peer's checkpoints can be
read by another (each writes under its own --checkpoint-dir). The victim is replica 0 of its stage, the
peer that used to be the only checkpoint writer: the issue's reproduction, where the survivors then
failed on a checkpoint directory that lived only on the dead peer's disk."""

import re
import signal

import pytest
import torch
from safetensors.torch import load_file

from potluck.protocol.checkpoints import check_step, step_dir, weights_path
from potluck.protocol.identity import Identity
from potluck.testbed.harness.jobs import job_toml
from potluck.testbed.localswarm import LocalSwarm
from tests.helpers.logs import assert_no_step_lost, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STEPS = 80
INTERVAL = 10  # checkpoints all along: none may be needed, and the victim writes them too


@pytest.mark.parametrize(
    "sig",
    [signal.SIGKILL, pytest.param(signal.SIGTERM, marks=pytest.mark.extended)],  # sigterm: full tier only
    ids=["sigkill", "sigterm"],
)
def test_a_replica_leaving_costs_no_committed_step(tmp_path, sig):
    """SIGKILL (a crash) or SIGTERM (a graceful leave) of one replica: the next epoch starts where the
    survivors stand."""
    job = tmp_path / "job.toml"
    job.write_text(
        job_toml(
            "churn-test",
            steps=STEPS,
            ckpt=tmp_path / "owner-ckpt",
            interval=INTERVAL,
            stages=2,
            replicas=2,  # forced: on loaded cores the planner may judge 2x1 faster (the CI flake)
        )
    )
    peer_args = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu", "--ttl", "15")
    peer_args += ("--step-timeout", "5")
    with LocalSwarm(
        tmp_path / "run", job, swarm_id="churn-test", peer_args=peer_args, coordinator_args=("--json",)
    ) as swarm:
        swarm.start_coordinator()
        names = ("a", "b", "c", "d")
        for name in names:  # each peer keeps its checkpoints on its own "disk"
            swarm.start_peer(name, "--checkpoint-dir", str(tmp_path / "run" / name / "ckpt"))
        log = swarm.procs["coordinator"].log
        wait_for(log, r"plan epoch 1: 2 stages x 2 replicas", 120)
        wait_for(log, r"step (1[5-9]|[2-9]\d)/", 120)  # past the first checkpoint
        ids = {n: Identity.load(tmp_path / "run" / n / "identity.pem").peer_id for n in names}
        text = log.read_text(errors="replace")
        epoch1 = text[text.index("plan epoch 1") :]
        stage1 = re.search(r"│ 1 +│ [0-9-]+ +│ (\w{12}), (\w{12})", epoch1)
        assert stage1 is not None, epoch1[-3000:]
        victim = next(n for n, pid in ids.items() if pid.startswith(stage1.group(1)))  # replica 0
        before = max(int(s) for s in re.findall(r"step (\d+)/", log.read_text(errors="replace")))
        swarm.stop(victim, sig, timeout_s=90)  # SIGTERM: it hands its work over first (test_leave.py)

        start = int(wait_for(log, r"plan epoch 2: .*?from step (\d+)", 90).group(1))
        assert start >= before, f"epoch 2 starts at step {start}; the swarm had committed {before}"

        coordinator = swarm.procs["coordinator"]
        coordinator.popen.wait(timeout=180)  # launch ends by itself at the job's last step
        text = log.read_text(errors="replace")
        assert coordinator.popen.returncode == 0, text[-3000:]
        assert_no_step_lost(text, STEPS, before, "kill")
    # The owner's copy holds the last step, complete, pulled from the peers' disks.
    assert check_step(step_dir(tmp_path / "owner-ckpt", STEPS)).step == STEPS
    # Every surviving replica of a stage wrote the last step to its own disk: all bit-identical.
    by_stage: dict[int, list[dict[str, torch.Tensor]]] = {}
    for name in names:
        last = step_dir(tmp_path / "run" / name / "ckpt", STEPS)
        for stage in (0, 1):
            if name != victim and weights_path(last, stage).exists():
                by_stage.setdefault(stage, []).append(load_file(str(weights_path(last, stage))))
    assert sorted(by_stage) == [0, 1] and max(len(v) for v in by_stage.values()) >= 2, by_stage.keys()
    for stage, copies in by_stage.items():
        first = copies[0]
        for other in copies[1:]:  # weights and AdamW moments alike
            assert other.keys() == first.keys()
            assert all(torch.equal(other[k], first[k]) for k in first), f"stage {stage} replicas differ"


@pytest.mark.extended  # the commit tier's churn swarm is the SIGKILL above
def test_a_job_below_min_peers_after_a_kill_replans_on_the_peers_it_has(tmp_path):
    """Issue 38, item 0: ``min_peers`` is the threshold to start, not to go on. A 1 x 4 job with
    ``min_peers = 4`` loses its stage leader (replica 0) to SIGKILL mid-run; the three survivors hold the
    model, so the coordinator re-plans on them at once, from their live step, and the job reaches its
    last step (it used to publish no plan while the survivors dialled the dead leader)."""
    job = tmp_path / "job.toml"
    job.write_text(
        job_toml(
            "stall-test", steps=STEPS, ckpt=tmp_path / "owner-ckpt", interval=INTERVAL, min_peers=4, stages=1
        )
    )
    peer_args = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu", "--ttl", "15")
    peer_args += ("--step-timeout", "5")
    with LocalSwarm(
        tmp_path / "run", job, swarm_id="stall-test", peer_args=peer_args, coordinator_args=("--json",)
    ) as swarm:
        swarm.start_coordinator()
        names = ("a", "b", "c", "d")
        for name in names:
            swarm.start_peer(name, "--checkpoint-dir", str(tmp_path / "run" / name / "ckpt"))
        log = swarm.procs["coordinator"].log
        wait_for(log, r"plan epoch 1: 1 stages x 4 replicas", 120)
        wait_for(log, r"step (1[5-9]|[2-9]\d)/", 120)
        ids = {n: Identity.load(tmp_path / "run" / n / "identity.pem").peer_id for n in names}
        text = log.read_text(errors="replace")
        stage0 = re.search(r"│ 0 +│ [0-9-]+ +│ (\w{12}),", text[text.index("plan epoch 1") :])
        assert stage0 is not None, text[-3000:]
        leader = next(n for n, pid in ids.items() if pid.startswith(stage0.group(1)))
        before = max(int(s) for s in re.findall(r"step (\d+)/", log.read_text(errors="replace")))
        swarm.stop(leader, signal.SIGKILL, timeout_s=90)

        start = int(wait_for(log, r"plan epoch 2: 1 stages x 3 replicas.*?from step (\d+)", 120).group(1))
        assert start >= before, f"epoch 2 starts at step {start}; the swarm had committed {before}"
        coordinator = swarm.procs["coordinator"]
        coordinator.popen.wait(timeout=180)
        text = log.read_text(errors="replace")
        assert coordinator.popen.returncode == 0, text[-3000:]
        assert_no_step_lost(text, STEPS, before, "kill")
