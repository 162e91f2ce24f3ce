"""Coordinator loss: SIGKILL `potluck launch` mid-run, start it again with the same key and swarm id.

The peers keep training under the plan they hold while it is gone; the restarted coordinator rejoins
through the peers it remembers (it listens on a new port, so the old invite's address is dead), recovers
plan epoch 1 and the progress from the DHT instead of publishing a new epoch 1, and ends the job with its
summary. Every peer follows strictly increasing epochs."""

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import pytest

from potluck.coordinator.config import CoordinatorConfig
from potluck.coordinator.memory import SwarmMemory, memory_path, save_memory
from potluck.coordinator.service import CoordinatorService
from potluck.net.config import NetworkConfig
from potluck.net.node import SwarmNode
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.identity import Identity
from potluck.protocol.keys import PLAN
from potluck.testbed.faults import ENV as FAULTS
from potluck.testbed.faults import delay, encode
from potluck.testbed.harness.jobs import job_toml
from potluck.testbed.localswarm import LOOPBACK, LocalSwarm
from tests.helpers.logs import launch_summary, wait_for
from tests.unit.coordinator.job.test_plan import JOB
from tests.unit.coordinator.job.test_recover import plan

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]
SLOW = pytest.mark.skipif(os.environ.get("POTLUCK_SLOW_TESTS") != "1", reason="POTLUCK_SLOW_TESTS=1 runs it")

# Paced steps (an injected delay, testbed/faults.py: every step of every peer sleeps PACE_S) take ~0.35 s
# whatever the machine's speed, and the peers leave the 2 cores to the restarting coordinator. The job
# only has to outlast the restart (SIGKILL -> "recovered", 8-20 s on a busy 2-core machine: steps 25-45);
# 90 steps (~30 s) leave room for twice that.
PACE_S = 0.25
STEPS = 90


def _steps(text: str) -> list[int]:
    return [int(s) for s in re.findall(r"step (\d+)/", text)]


def _table(text: str) -> str:
    """The first plan table in ``text``."""
    m = re.search(r"┏.*?└[─┴]+┘", text, re.S)
    assert m, text[-3000:]
    return m[0]


def _identity_once_written(path: Path, timeout_s: float) -> Identity:
    """A starting peer's key, once it has written it (within seconds of its start; longer under load)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} not written in {timeout_s} s"
        time.sleep(0.2)
    return Identity.load(path)  # written whole: Identity.save renames a synced file into place


def _first_plan_listing(log: Path, peer_prefix: str, start: int, timeout_s: float) -> str:
    """The table of the first plan published after ``start`` that lists ``peer_prefix`` (placed or spare).
    The survivor alone may be re-planned again before the newcomer is seen; those plans are skipped."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = max(1.0, deadline - time.monotonic())
        published = wait_for(log, r"published plan epoch (\d+) ", left, start=start)
        wait_for(log, rf"plan epoch {published[1]}: .*\n(.*\n){{2,}}└", 10, start=published.start())
        table = _table(log.read_text(errors="replace")[published.start() :])
        if peer_prefix in table:
            return table
        assert time.monotonic() < deadline, f"no plan listing {peer_prefix} in {timeout_s} s:\n{table}"
        start = published.end()


def _stage0(table: str) -> set[str]:
    """The peer id prefixes placed in stage 0 of a plan table."""
    row = re.search(r"│ 0 +│ [0-9-]+ +│ ([^│]*)│", table)
    assert row, table
    return set(re.findall(r"\w{12}", row[1]))


# carry-on (2 stages x 1 replica run to the end under epoch 1 after the restart) is the first half of
# then-replan; it runs only with POTLUCK_SLOW_TESTS=1 to keep the suite within its time budget.
@pytest.mark.parametrize(
    "then_kill_a_peer",
    [pytest.param(False, marks=SLOW), pytest.param(True, marks=pytest.mark.extended)],
    ids=["carry-on", "then-replan"],
)
def test_a_restarted_coordinator_carries_on_with_the_running_plan(tmp_path, monkeypatch, then_kill_a_peer):
    """carry-on: 2 stages x 1 replica run to the end under epoch 1. then-replan: 1 stage x 2 replicas;
    after the restart a placed peer is SIGKILLed, and once the restarted coordinator is left with too few
    peers to plan, a third peer joins and the coordinator re-plans with epoch 2 (above the one it
    recovered), not epoch 1, over the survivor and the newcomer (1 x 2, forced).

    The third peer joins only then: an unplaced peer that is live at the restart is priced by the
    restarted coordinator as a newcomer, and it may hand the running plan over to it by itself (a
    re-plan racing the kill)."""
    # Forced: on a loaded box the planner may find a second replica not worth it, and the test needs one.
    limits = {"stages": 1, "replicas": 2} if then_kill_a_peer else {"stages": 2}
    steps = STEPS
    names = ["a", "b"]
    job = tmp_path / "job.toml"
    job.write_text(
        job_toml(
            "restart-test", steps=steps, ckpt=tmp_path / "owner-ckpt", interval=1000, d_model=128, **limits
        )
    )
    peer_args = ("--probe-seconds", "0.1", "--threads", "1", "--device", "cpu")
    # Link rounds every 3 s, not 120: a peer that joined a moment before the other reports its link in
    # time for the first plan, which would otherwise wait out the coordinator's link_wait_s (15 s).
    peer_args += ("--link-interval", "3")
    if then_kill_a_peer:
        # Its neighbour notices within seconds when it waits for the victim's commit vote; when it waits
        # in the all-reduce (bounded by 60 s, not --step-timeout), the victim's heartbeat expires soon.
        peer_args += ("--step-timeout", "5", "--ttl", "8")
    else:
        peer_args += ("--ttl", "15")
    monkeypatch.setenv(FAULTS, encode(delay(PACE_S)))  # inherited by the peers started below
    run = tmp_path / "run"
    with LocalSwarm(
        run, job, swarm_id="restart-test", peer_args=peer_args, coordinator_args=("--json",), verbose=1
    ) as swarm:

        def start_peer(name: str) -> None:  # each peer keeps its checkpoints on its own "disk"
            swarm.start_peer(name, "--checkpoint-dir", str(run / name / "ckpt"))

        swarm.start_coordinator()
        for name in names:
            start_peer(name)
        first = swarm.procs["coordinator"].log
        wait_for(first, r"plan epoch 1: ", 120)
        wait_for(first, r"step ([5-9]|\d\d+)/", 120)
        swarm.stop("coordinator", signal.SIGKILL)
        before = max(_steps((run / "coordinator.log").read_text(errors="replace")))
        time.sleep(2)  # the peers are on their own now (and while the new launch starts, seconds)

        swarm.start_coordinator(restart=True)
        coordinator = swarm.procs["coordinator"]
        log = coordinator.log
        recovered = wait_for(log, r"recovered: plan epoch (\d+) \(read from the DHT\) at step (\d+)", 60)
        assert int(recovered.group(1)) == 1
        assert before < int(recovered.group(2)) < steps, "the restart should land mid-run: " + recovered[0]
        assert "rejoined swarm restart-test through the peers it remembers" in log.read_text()
        victim = None
        ids: dict[str, str] = {}
        if then_kill_a_peer:
            table = wait_for(log, r"│ 0 +│ [0-9-]+ +│ (\w{12}), (\w{12})", 30)
            ids = {n: Identity.load(run / n / "identity.pem").peer_id for n in names}
            victim = next(n for n, pid in ids.items() if pid.startswith(table.group(2)))
            survivor = next(n for n in names if n != victim)
            assert ids[survivor].startswith(table.group(1)), table[0]
            killed_at = len(log.read_text(errors="replace"))
            swarm.stop(victim, signal.SIGKILL)
            # below min_peers the running job goes on with the survivor alone, narrower than the 2
            # replicas it forces (issue 38, item 0), and grows back when a newcomer comes
            alone = wait_for(log, r"published plan epoch (\d+) .*?1 while 1 live", 90, start=killed_at)
            start_peer("c")
            names.append("c")
            ids["c"] = _identity_once_written(run / "c" / "identity.pem", 60).peer_id
            table2 = _first_plan_listing(log, ids["c"][:12], alone.end(), 120)
            assert _stage0(table2) <= {ids[survivor][:12], ids["c"][:12]}, table2
            assert ids[survivor][:12] in table2 and ids["c"][:12] in table2, table2  # placed or spare
        coordinator.popen.wait(timeout=300)  # it ends by itself at the job's last step
        text = log.read_text(errors="replace")
        assert coordinator.popen.returncode == 0, text[-3000:]
        summary = launch_summary(text)
        assert summary["steps"] == steps and summary["stages"] == limits["stages"], summary
        after = _steps(text)
        assert after and min(after) > before, (
            f"no step while the coordinator was gone: {before} -> {after[:3]}"
        )
        # The restarted coordinator never published an epoch at or below the one it recovered.
        published = [int(e) for e in re.findall(r"published plan epoch (\d+)", text)]
        assert all(e > 1 for e in published) and (published or not then_kill_a_peer), published
        last = _stage0(_table(text[[m.start() for m in re.finditer(r"plan epoch \d+: ", text)][-1] :]))
        for name in names:
            peer_log = (run / f"{name}.log").read_text(errors="replace")
            followed = [int(e) for e in re.findall(r"plan epoch (\d+) \((?:training|done)\)", peer_log)]
            assert followed and followed == sorted(set(followed)), (name, followed)  # strictly increasing
            if name == victim:
                continue
            assert re.search(rf"plan epoch {followed[-1]} \(done\)", peer_log), (name, followed)
            if not ids or ids[name][:12] in last:  # placed in the last plan (not its spare)
                assert "finished the job at step" in peer_log, peer_log[-2000:]


def _service(tmp_path, ident: Identity, **changes: object) -> CoordinatorService:
    net = NetworkConfig(host_maddrs=(LOOPBACK,), bootstrap_timeout_s=20.0)
    fields: dict[str, object] = {"recover_peers_s": 1.0, "rejoin_timeout_s": 3.0, "poll_interval_s": 0.5}
    cfg = CoordinatorConfig(
        swarm_id="rejoin-test", identity_path=tmp_path / "coordinator.pem", net=net, **{**fields, **changes}
    )  # type: ignore[arg-type]
    return CoordinatorService(cfg, JOB, ident)


def test_a_restart_reads_the_live_plan_through_a_remembered_peer_and_plans_above_it(tmp_path):
    """The old coordinator published epoch 3 and died; a peer it remembered still holds the record. It
    also published its single-use token's use: the restarted one refuses a second peer on it."""
    from hivemind.utils import get_dht_time

    from potluck.coordinator.admission import AdmissionDesk
    from potluck.coordinator.config import AdmitConfig
    from potluck.protocol.admission import JoinToken
    from potluck.protocol.errors import AdmissionError
    from potluck.protocol.keys import TOKENS

    ident = Identity.generate()
    token = JoinToken.mint(ident, "rejoin-test", time.time() + 600, max_uses=1)
    first, second = Identity.generate().peer_id, Identity.generate().peer_id

    async def main() -> tuple[int, int, int, str]:
        policy = TrustPolicy("rejoin-test", ident.public_key)
        net = NetworkConfig(host_maddrs=(LOOPBACK,))
        holder = await SwarmNode.start(Identity.generate(), policy, net)
        try:
            addrs = tuple(await holder.visible_maddrs())
            old = await SwarmNode.start(ident, policy, net, addrs)
            assert await old.publish(PLAN.name, plan(3).model_copy(update={"job": JOB.name}), 300.0)
            old_desk = AdmissionDesk(ident, "rejoin-test", AdmitConfig(), set())
            old_desk.decide(first, token, get_dht_time())
            assert await old.publish(TOKENS.name, old_desk.record(get_dht_time()), 300.0)
            await old.shutdown()
            memory = SwarmMemory("rejoin-test", JOB.name, {holder.identity.peer_id: addrs}, {})
            save_memory(memory_path(tmp_path / "coordinator.pem", "rejoin-test"), memory)
            svc = _service(tmp_path, ident)
            await svc.start()
            try:
                assert svc.plan is not None
                stored = [v.record for v in await holder.fetch(PLAN.name)]
                try:
                    svc.desk.decide(second, token, get_dht_time())
                    refused = "admitted"
                except AdmissionError as e:
                    refused = str(e)
                svc.desk.decide(first, token, get_dht_time())  # its renewal uses nothing up
                newest = max(p.epoch for p in stored)  # type: ignore[attr-defined]
                return svc.plan.epoch, svc.first_epoch, newest, refused
            finally:
                await svc.stop()
        finally:
            await holder.shutdown()

    epoch, first_epoch, newest, refused = asyncio.run(main())
    assert (epoch, first_epoch, newest) == (3, 4, 3)
    assert "used up" in refused


def test_remembered_peers_all_gone_start_a_new_dht_and_the_saved_plan_carries_on(tmp_path):
    ident = Identity.generate()
    dead = Identity.generate().peer_id
    saved = plan(5).model_copy(update={"job": JOB.name})
    memory = SwarmMemory("rejoin-test", JOB.name, {dead: (f"/ip4/127.0.0.1/tcp/1/p2p/{dead}",)}, {}, saved)
    save_memory(memory_path(tmp_path / "coordinator.pem", "rejoin-test"), memory)

    async def main() -> tuple[int, int, list[int]]:
        svc = _service(tmp_path, ident)
        await svc.start()
        try:
            assert svc.plan is not None and svc.node is not None
            stored = [v.record.epoch for v in await svc.node.fetch(PLAN.name)]  # type: ignore[attr-defined]
            return svc.plan.epoch, svc.first_epoch, stored
        finally:
            await svc.stop()

    # Republished: the record had expired while the coordinator was away (here: a new DHT).
    assert asyncio.run(main()) == (5, 6, [5])
