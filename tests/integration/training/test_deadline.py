"""``sync.policy = "deadline"``: a replica slowed several times by a sleep is left out of steps, catches
up by applying the committed mean, and ends with the same parameters as the others; the others keep
going.

The slowdown is an injected delay (``testbed/faults.delay(S, replicas=[R])``: only replica R sleeps S
seconds per step, before its gradients count as ready), so the same fault slows one trainer of an
in-process swarm or one peer process."""

import asyncio
import json
import re
from datetime import datetime

import pytest
import torch
from safetensors.torch import load_file

from potluck.model.reference import parameters_by_global_name, reference_run
from potluck.net.config import TransportConfig
from potluck.net.mailbox import Mailbox
from potluck.peer.config import TrainerConfig
from potluck.peer.errors import StragglerError
from potluck.peer.train.trainer import StepReport, Trainer
from potluck.testbed.faults import ENV as FAULTS
from potluck.testbed.faults import delay, encode
from potluck.testbed.harness.jobs import job_toml
from potluck.testbed.harness.p2p import p2p_group
from potluck.testbed.harness.training import PROTOCOL, make_plan, tiny_dataset, tiny_job, train_swarm
from potluck.testbed.localswarm import LocalSwarm
from tests.helpers.logs import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SLOW_S = 1.0  # the slow replica's extra seconds per step: several times a tiny step's compute
# The peer processes' straggler sleeps longer: in a loaded full tier the fast peers' own steps came
# close to 1 s, and nobody was left out (2026-11-29).
PEER_SLOW_S = 2.0
SYNC = {"policy": "deadline", "deadline_factor": 1.0, "min_deadline_s": 0.3, "max_misses": 1000}


def test_deadline_policy_without_stragglers_matches_the_reference(tmp_path, monkeypatch):
    """Nobody late (a generous floor): the deadline path's R x mean is the strict path's sum."""
    monkeypatch.delenv(FAULTS, raising=False)
    job = tiny_job(steps=10, sync={"policy": "deadline", "min_deadline_s": 60.0})
    reports, trainers = asyncio.run(train_swarm(job, 2, 2, [(0, 2), (2, 4)], tmp_path))
    assert all(tr.deadline is not None and tr.deadline.left_out == 0 for tr in trainers.values())
    losses = [r.loss for r in reports[(1, 0)]]
    ref_losses, ref = reference_run(job, tiny_dataset(job), n_replicas=2)
    assert losses == pytest.approx(ref_losses, rel=1e-4, abs=1e-5)
    want = parameters_by_global_name(ref)
    for key, tr in trainers.items():
        for name, tensor in parameters_by_global_name(tr.runner).items():
            torch.testing.assert_close(tensor, want[name], rtol=1e-3, atol=2e-5, msg=f"{key} {name}")


def test_a_slow_replica_is_left_out_and_ends_identical(tmp_path, monkeypatch):
    """1 stage x 3 replicas in one process, replica 2 slowed: the fast two finish first, the slow one is
    left out and catches up; all three hold bit-identical weights and optimizer state."""
    monkeypatch.setenv(FAULTS, encode(delay(SLOW_S, replicas=[2])))
    job = tiny_job(steps=10, sync=SYNC)
    dataset = tiny_dataset(job)
    slow_step_when_fast_done: list[int] = []

    async def main() -> tuple[dict[int, list[StepReport]], dict[int, Trainer]]:
        async with p2p_group(3) as nodes:
            boxes = [Mailbox(n, PROTOCOL, TransportConfig(timeout_s=30)) for n in nodes]
            for box in boxes:
                await box.start()
            plan = make_plan(job, [[b.peer_id for b in boxes]], [(0, job.model.n_layers)])
            cfg = TrainerConfig(step_timeout_s=60)
            trainers = {}
            for box in boxes:
                tr = Trainer(box, job, plan, dataset, cfg, tmp_path / box.peer_id[-6:])
                trainers[tr.replica] = tr
            reports: dict[int, list[StepReport]] = {r: [] for r in trainers}

            def on_step(replica: int, report: StepReport) -> None:
                reports[replica].append(report)
                if replica == 0 and report.step + 1 == job.steps:
                    slow_step_when_fast_done.append(trainers[2].step)

            await asyncio.gather(*(tr.run(lambda rep, r=r: on_step(r, rep)) for r, tr in trainers.items()))
            for box in boxes:
                await box.close()
            return reports, trainers

    reports, trainers = asyncio.run(main())
    slow, fast = trainers[2].deadline, trainers[0].deadline
    assert slow is not None and fast is not None
    assert slow.left_out > 0 and fast.left_out == 0  # the round's leader is never left out
    assert slow_step_when_fast_done and slow_step_when_fast_done[0] < job.steps  # not bound by the slow one
    losses = [r.loss for r in reports[0]]
    assert len(losses) == job.steps and all([r.loss for r in reports[i]] == losses for i in trainers)
    state = trainers[0].runner.state_tensors()
    for replica in (1, 2):
        other = trainers[replica].runner.state_tensors()
        assert other.keys() == state.keys()
        for name, tensor in state.items():
            assert torch.equal(other[name], tensor), (replica, name)


def test_a_slow_pipeline_replica_is_left_out_of_both_stages(tmp_path, monkeypatch):
    """2 stages x 2 replicas, replica 1 of each stage slowed: pipeline 1 is left out, both stages'
    replicas still end identical and agree on every step's loss."""
    monkeypatch.setenv(FAULTS, encode(delay(SLOW_S, replicas=[1])))
    job = tiny_job(steps=8, sync=SYNC)
    reports, trainers = asyncio.run(train_swarm(job, 2, 2, [(0, 2), (2, 4)], tmp_path))
    assert all(tr.step == job.steps for tr in trainers.values())
    for stage in (0, 1):
        slow, fast = trainers[(stage, 1)], trainers[(stage, 0)]
        assert slow.deadline is not None and slow.deadline.left_out > 0, stage
        assert [r.loss for r in reports[(stage, 1)]] == [r.loss for r in reports[(1, 0)]]
        a, b = fast.runner.state_tensors(), slow.runner.state_tensors()
        assert all(torch.equal(a[name], b[name]) for name in a), stage


def test_repeated_misses_are_reported_as_failures(tmp_path, monkeypatch):
    """max_misses = 2: the slow replica reports itself and the leader reports it, both as
    StragglerError, after the same step and with the same weights (the last catch-up was delivered)."""
    monkeypatch.setenv(FAULTS, encode(delay(SLOW_S, replicas=[1])))
    job = tiny_job(steps=10, sync={**SYNC, "max_misses": 2})

    async def main() -> tuple[list[object], list[Trainer]]:
        async with p2p_group(2) as nodes:
            boxes = [Mailbox(n, PROTOCOL, TransportConfig(timeout_s=30)) for n in nodes]
            for box in boxes:
                await box.start()
            plan = make_plan(job, [[b.peer_id for b in boxes]], [(0, job.model.n_layers)])
            dataset = tiny_dataset(job)
            cfg = TrainerConfig(step_timeout_s=60)
            trainers = [Trainer(b, job, plan, dataset, cfg, tmp_path / str(i)) for i, b in enumerate(boxes)]
            trainers.sort(key=lambda t: t.replica)
            out = await asyncio.gather(*(tr.run() for tr in trainers), return_exceptions=True)
            for box in boxes:
                await box.close()
            return list(out), trainers

    out, trainers = asyncio.run(main())
    assert all(isinstance(o, StragglerError) for o in out), out
    assert "replica 1" in str(out[0]) and "2 steps in a row" in str(out[1])
    assert trainers[0].step == trainers[1].step < job.steps
    a, b = trainers[0].runner.state_tensors(), trainers[1].runner.state_tensors()
    assert all(torch.equal(a[name], b[name]) for name in a)


def _finished_at(text: str) -> datetime:
    line = next(ln for ln in text.splitlines() if "finished the job at step" in ln)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


@pytest.mark.extended  # full tier only (docs/development.md, Tests)
def test_a_slow_peer_is_left_out_on_a_local_swarm(tmp_path, monkeypatch):
    """Real peer processes, each in its own directory, 1 stage x 3 replicas; whichever peer is replica 2
    sleeps PEER_SLOW_S per step. It is left out of steps, the other two finish the job first, and all three
    write the same final checkpoint."""
    steps = 16
    monkeypatch.setenv(FAULTS, encode(delay(PEER_SLOW_S, replicas=[2])))  # inherited by the peers below
    text = job_toml(
        "deadline-test", steps=steps, ckpt=tmp_path / "owner-ckpt", interval=1000, stages=1, replicas=3
    )
    text = text.replace("min_peers = 2", "min_peers = 3")
    text += "[sync]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in SYNC.items())
    # Every step synced: "auto" chooses 16 local steps when a loaded box measures its loopback links
    # under 1 Gbit/s, and then the job's one outer sync is the only round anyone can be left out of.
    text += '[compression]\nactivations = "int8:block=64"\ngradients = "int8:block=64"\nsync_every = 1\n'
    job = tmp_path / "job.toml"
    job.write_text(text)
    peer_args = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu", "--ttl", "15")
    names = ("a", "b", "c")
    run = tmp_path / "run"
    with LocalSwarm(
        run, job, swarm_id="deadline-test", peer_args=peer_args, coordinator_args=("--json",), verbose=1
    ) as swarm:
        swarm.start_coordinator()
        for name in names:
            swarm.start_peer(
                name, "--state-dir", str(run / name), "--checkpoint-dir", str(run / name / "ckpt")
            )
        coordinator = swarm.procs["coordinator"]
        wait_for(coordinator.log, r"plan epoch 1: 1 stages? x 3 replicas", 120)
        coordinator.popen.wait(timeout=240)  # launch ends by itself once every replica reports the last step
        out = coordinator.log.read_text(errors="replace")
        assert coordinator.popen.returncode == 0, out[-3000:]
        summary = json.loads([ln for ln in out.splitlines() if ln.startswith('{"steps"')][-1])
        assert summary["steps"] == steps
        logs = {n: swarm.procs[n].log.read_text(errors="replace") for n in names}
    assert len(re.findall(r"plan epoch \d+: ", out)) == 1, "a straggler must not cost a re-plan"
    left_out = {n: len(re.findall(r"left out of step \d+", t)) for n, t in logs.items()}
    slow = max(left_out, key=left_out.__getitem__)
    assert left_out[slow] > 0 and left_out[slow] > sum(v for n, v in left_out.items() if n != slow), left_out
    fast = [n for n in names if n != slow]
    # The others keep their pace: both finish the job before the slow peer has caught up.
    assert max(_finished_at(logs[n]) for n in fast) < _finished_at(logs[slow]), left_out
    finals = {n: sorted((run / n / "ckpt").glob(f"step-{steps:08d}/stage-000.safetensors")) for n in names}
    assert all(len(f) == 1 for f in finals.values()), finals
    want = load_file(finals[slow][0])
    for n in fast:
        got = load_file(finals[n][0])
        assert got.keys() == want.keys()
        for key, tensor in want.items():
            assert torch.equal(got[key], tensor), (n, key)
