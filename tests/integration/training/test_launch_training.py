"""`potluck launch` runs a job to its end with real peer processes; a peer with too little memory is kept
as a spare and told why; `potluck status` shows the plan and the progress; a peer killed mid-training is suspected by its
neighbour and replaced within seconds."""

import json
import re
import signal
import time

import pytest

from potluck.protocol.identity import Identity
from potluck.testbed.harness.jobs import job_toml
from potluck.testbed.localswarm import LocalSwarm
from tests.helpers.swarm import status_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def launch_job(ckpt, steps: int = 8) -> str:
    return job_toml(
        "launch-test", steps=steps, ckpt=ckpt, interval=4, n_layers=2, d_model=128, stages=2, replicas=1
    )


def test_launch_trains_to_the_end_and_explains_spares(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(launch_job(tmp_path / "ckpt"))
    peer_args = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu")
    with LocalSwarm(
        tmp_path / "run", job, swarm_id="launch-test", peer_args=peer_args, coordinator_args=("--json",)
    ) as swarm:
        swarm.start_coordinator()
        swarm.start_peer("small", "--max-memory", "1MiB")  # cannot hold one 128-wide layer
        swarm.start_peer("a")
        swarm.start_peer("b")
        coordinator = swarm.procs["coordinator"]
        coordinator.popen.wait(timeout=240)  # launch ends by itself at the job's last step
        log = coordinator.log.read_text()
        assert coordinator.popen.returncode == 0, log[-3000:]
        summary = json.loads([line for line in log.splitlines() if line.startswith('{"steps"')][-1])
        assert summary["steps"] == 8 and summary["stages"] == 2 and summary["replicas"] == 1
        assert summary["checkpoint"].endswith("step-00000008")
        assert "too little memory" in log  # the plan table lists the spare and why
        # no [compression]: the coordinator chose (issue 38), and the peers sent with its choice: fp32
        # activations and their gradients (128 tokens x 128 wide, 64 KiB each way) or int8 (a quarter)
        chose = re.search(r"compression \(auto\):\s+activations\s+(\S+?);", log)
        assert chose is not None, log[-3000:]
        sent = summary["bytes_per_step"]
        assert sent > 2 * 65536 if chose.group(1) == "none" else sent < 65536, (chose.group(1), sent)
    assert (tmp_path / "ckpt" / "step-00000008" / "stage-001.json").exists()


@pytest.mark.extended  # full tier only (docs/development.md, Tests)
def test_status_shows_plan_and_progress(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(launch_job(tmp_path / "ckpt", steps=400))
    peer_args = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu")
    with LocalSwarm(tmp_path / "run", job, swarm_id="status-test", peer_args=peer_args) as swarm:
        invite = swarm.start_coordinator()
        swarm.start_peer("a")
        swarm.start_peer("b")
        doc: dict = {}
        for _ in range(60):
            doc = status_json(invite)
            if doc["plan"] and any(r["step"] >= 2 for r in doc["progress"]):
                break
        assert doc["plan"]["status"] == "training" and len(doc["plan"]["stages"]) == 2
        states = {r["peer_id"]: r for r in doc["progress"]}
        assert len(states) == 2 and all(r["state"] == "training" for r in states.values())
        assert any(r["loss"] is not None and r["timing"]["total"] > 0 for r in states.values())


@pytest.mark.extended  # full tier only (docs/development.md, Tests)
def test_a_killed_peer_is_suspected_and_replaced_before_its_heartbeat_expires(tmp_path):
    """SIGKILL leaves no "leaving" record: the peer's heartbeat lives on for up to its TTL (60 s here).
    Its neighbour's stream fails, the neighbour names it as a suspect, and the coordinator re-plans
    without it once its next heartbeat is overdue (interval 20 s + 5 s), not when the TTL runs out."""
    job = tmp_path / "job.toml"
    job.write_text(launch_job(tmp_path / "ckpt", steps=100000))
    peer_args = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu")
    peer_args += ("--ttl", "60", "--step-timeout", "5")
    with LocalSwarm(tmp_path / "run", job, swarm_id="suspect-test", peer_args=peer_args) as swarm:
        swarm.start_coordinator()
        for name in ("a", "b", "c"):
            swarm.start_peer(name)
        log = swarm.procs["coordinator"].log
        ids = {}
        for _ in range(240):  # the first plan, and a few steps under it
            text = log.read_text(errors="replace")
            if re.search(r"step \d+/100000", text):
                break
            time.sleep(0.5)
        assert re.search(r"step \d+/100000", text), text[-3000:]
        for name in ("a", "b", "c"):
            ids[name] = Identity.load(tmp_path / "run" / name / "identity.pem").peer_id
        stage1 = re.search(r"│ 1 +│ [0-9-]+ +│ (\w{12})", text)
        assert stage1 is not None, text[-3000:]
        victim = next(n for n, pid in ids.items() if pid.startswith(stage1.group(1)))
        swarm.stop(victim, signal.SIGKILL)
        killed = time.monotonic()
        while "plan epoch 2" not in (text := log.read_text(errors="replace")):
            assert time.monotonic() - killed < 60, text[-3000:]
            time.sleep(0.5)
        elapsed = time.monotonic() - killed
        epoch2 = text[text.index("plan epoch 2") :]
        assert "suspected" in epoch2, epoch2  # left out as a suspect, listed as a spare with the reason
        assert elapsed < 40, f"re-planned {elapsed:.0f} s after the kill: the TTL, not the suspicion"
