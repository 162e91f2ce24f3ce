"""Tick-tock end to end (issue 19): a peer started with ``--slots 2`` is given two replicas' shares by the
coordinator's plan, runs them as two waves, and the job reaches the loss three separate peers reach."""

import json
import re

import pytest

from potluck.model.data import load_dataset
from potluck.model.reference import reference_run
from potluck.protocol.jobspec import load_job
from potluck.testbed.harness.jobs import job_toml
from potluck.testbed.localswarm import LocalSwarm

pytestmark = [pytest.mark.integration, pytest.mark.extended, pytest.mark.timeout(300)]

STEPS = 6


def test_a_two_slot_peer_hosts_two_replicas_and_the_loss_is_the_reference(tmp_path):
    # three replicas of the whole model and two peers: only a plan with two waves on "a" has them
    text = job_toml("ticktock-e2e", steps=STEPS, ckpt=tmp_path / "ckpt", interval=3, stages=1, replicas=3)
    text += '[compression]\ngradients = "none"\nerror_feedback = false\n'
    path = tmp_path / "job.toml"
    path.write_text(text)
    peer_args = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu")
    with LocalSwarm(
        tmp_path / "run", path, swarm_id="ticktock-e2e", peer_args=peer_args, coordinator_args=("--json",)
    ) as swarm:
        swarm.start_coordinator()
        swarm.start_peer("a", "--slots", "2")
        swarm.start_peer("b")
        coordinator = swarm.procs["coordinator"]
        coordinator.popen.wait(timeout=240)
        log = coordinator.log.read_text()
        assert coordinator.popen.returncode == 0, log[-3000:]
        peer_log = swarm.procs["a"].log.read_text()
    flat = " ".join(log.split())  # rich wraps the plan table's caption
    assert "two waves on 1 peer(s) (tick-tock)" in flat, log[-3000:]
    assert "(3 with tick-tock waves)" in flat and "(2 waves)" in flat  # the plan table says so
    # "a" trained two of the three shards of every step: two thirds of the tokens (128 a step)
    contributed = re.findall(r"contributed ([\d,]+) tokens", peer_log)
    assert contributed and int(contributed[-1].replace(",", "")) == STEPS * (128 * 2 // 3), peer_log[-3000:]
    summary = json.loads([line for line in log.splitlines() if line.startswith('{"steps"')][-1])
    assert summary["steps"] == STEPS and summary["stages"] == 1 and summary["replicas"] == 2

    job = load_job(path)
    dataset, _ = load_dataset(job.data, job.model.seq_len, job.model.vocab_size, job.seed)
    ref_losses, _ = reference_run(job, dataset, n_replicas=3)
    assert summary["loss_last"] == pytest.approx(ref_losses[-1], abs=2e-3)  # rounded to 4 digits
