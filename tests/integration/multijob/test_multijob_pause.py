"""Two jobs that cannot both run: time slicing with pauses, end to end on loopback (docs/multijob.md,
"Pauses").

Three peers, two jobs of two pipeline stages each (four peers asked for): the allocator's rounds give
one job both of a pipeline's peers and the other one peer or none, and swap at lease boundaries. The
job left short pauses: its peers stop together at a step, each with a checkpoint of it, and move; when
its lease gives it two peers again it resumes from exactly that step. B finishes, A trains on past the
step it resumed from, and no epoch of either starts before a step its peers had committed. (That A then
runs to its end adds no assertion here: test_multijob.py and test_space_sharing.py run theirs to the
end.)"""

import re
import time
from pathlib import Path

import pytest

from potluck.testbed.faults import ENV as FAULTS
from potluck.testbed.faults import delay, encode
from potluck.testbed.harness.jobs import job_toml
from tests.helpers.logs import launch_finished, wait_for
from tests.helpers.swarm import multijob_swarm

pytestmark = [pytest.mark.integration, pytest.mark.extended, pytest.mark.timeout(400)]

STEPS_A, STEPS_B = 2000, 200  # A must outlast two rounds after B arrives (~10 steps/s paced, 2 cores)
LEASE_S = 10
STEP_DELAY_S = 0.02
EPOCH_FROM = r"published plan epoch \d+ from step (\d+)"  # a launch log's epochs and where each starts


def _pauses_resume_where_they_stopped(text: str, job: str) -> int:
    """Every "pauses after step S" in a launch log is followed by an epoch published from step S (or the
    job's end); returns how many pauses the log shows."""
    pauses = [(m.end(), int(m.group(1))) for m in re.finditer(r"pauses after step (\d+)", text)]
    for at, stop in pauses:
        resumed = re.search(EPOCH_FROM, text[at:])
        if resumed is not None:
            assert int(resumed.group(1)) == stop, f"{job} paused after {stop}, resumed at {resumed.group(0)}"
    return len(pauses)


def _last_epoch_start(text: str) -> int:
    return [int(s) for s in re.findall(EPOCH_FROM, text)][-1]


def _wait_past_last_epoch(log: Path, timeout_s: float) -> str:
    """A's log once its newest epoch was published after its last pause (if any) and a step past that
    epoch's start is logged: A trains again."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = log.read_text(errors="replace")
        start, since = _last_epoch_start(text), text.rfind("published plan epoch")
        steps = [int(s) for s in re.findall(r"step (\d+)/", text[since:])]
        if since > text.rfind("pauses after step") and steps and max(steps) > start:
            return text
        assert time.monotonic() < deadline, (
            f"A's epoch from step {start} never got under way:\n{text[-3000:]}"
        )
        time.sleep(0.5)


def test_a_job_left_short_by_its_lease_pauses_and_resumes_from_the_step_it_stopped_at(tmp_path, monkeypatch):
    # At most ~45 steps/s whatever the machine: on a quiet fast one A ended before B's lease took its
    # peers, and nobody paused. Every peer process inherits this test-only delay (s per step).
    monkeypatch.setenv(FAULTS, encode(delay(STEP_DELAY_S)))
    for name, steps, seed in (("pa", STEPS_A, 0), ("pb", STEPS_B, 1)):
        text = job_toml(name, steps=steps, ckpt=tmp_path / f"{name}-ckpt", interval=1000, seed=seed, stages=2)
        (tmp_path / f"{name}.toml").write_text(text.replace("[limits]", "[limits]\nmax_replicas = 1"))
    with multijob_swarm(tmp_path, tmp_path / "pa.toml", "multijob-pause", LEASE_S) as swarm:
        swarm.start_coordinator()
        for name in ("p0", "p1", "p2"):
            swarm.start_peer(name)
        log_a = swarm.procs["coordinator"].log
        wait_for(log_a, r"plan epoch 1: ", 120)
        owner_b = swarm.start_job("job-b", tmp_path / "pb.toml", "--json")

        text_b = launch_finished(owner_b.popen, owner_b.log, STEPS_B, 300)
        # A paused while B held its peers (or B while A did); once B is done A has the peers to itself:
        # wait until A's last epoch is under way, a step past the one it started from.
        text_a = _wait_past_last_epoch(log_a, 120)
        peers = {n: swarm.procs[n].log.read_text(errors="replace") for n in ("p0", "p1", "p2")}

    # A peer that paused with its checkpoint and came back from B's lease waits for the epoch that
    # resumes A: it never runs the paused epoch again, from that epoch's first step up to the pause.
    # (No peer can still be running the paused epoch when the resuming one comes: the coordinator
    # resumes only once every placed peer reported the pause step.)
    for stop in re.findall(r"pauses after step (\d+)", text_a):
        for name, text in peers.items():
            rerun = f"from step {stop}: training on to step {stop} under the old plan"
            assert rerun not in text, f"{name} re-ran the paused epoch:\n{text[-3000:]}"

    # Three peers cannot hold two 2-peer pipelines: some job paused at least once, and each pause
    # resumed exactly where its peers stopped (the checkpoint they wrote there).
    pauses = _pauses_resume_where_they_stopped(text_a, "A") + _pauses_resume_where_they_stopped(text_b, "B")
    assert pauses >= 1, f"no pause seen:\n{text_a[-2000:]}\n{text_b[-2000:]}"
    for name, text in (("A", text_a), ("B", text_b)):
        starts = [int(s) for s in re.findall(EPOCH_FROM, text)]
        assert starts == sorted(starts), f"{name}'s epochs went back: {starts}"  # no committed step lost
