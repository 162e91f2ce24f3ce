"""The coordinator's job planning: swarm records + job -> a consistent TrainPlan, spares told why."""

from potluck.coordinator.job.plan import make_train_plan, step_job
from potluck.coordinator.placement.costmodel import peers_to_hold
from potluck.coordinator.state import SwarmState
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.membership import PeerView
from potluck.protocol.records import Hardware, LinkReport, LinkSample, PeerRecord
from tests.helpers.planning import memory_for

JOB = JobSpec.model_validate(
    {
        "name": "t",
        "min_peers": 4,
        "model": {"n_layers": 4, "d_model": 64, "n_heads": 4, "vocab_size": 256, "seq_len": 32},
        "batch": {"tokens_per_step": 32 * 16, "micro_batch_size": 2},
        "limits": {"stages": 2, "replicas": 2},
    }
)


def peer(pid: str, memory: int = 8 << 30, tflops: float = 0.1) -> PeerView:
    hw = Hardware(
        device_kind="cpu",
        device_name="cpu",
        memory_total_bytes=memory,
        memory_free_bytes=memory,
        cpu_cores=2,
        tflops_fp32=tflops,
        tflops_bf16=tflops,
    )
    return PeerView(PeerRecord(peer_id=pid, hardware=hw, issued_at=100.0), expiration=200.0)


def ids(n: int) -> list[str]:
    return sorted(Identity.generate().peer_id for _ in range(n))


def test_forced_shape_gives_a_consistent_2x2_plan_with_trees():
    pids = ids(5)
    state = SwarmState("s", 100.0, {p: peer(p) for p in pids})
    plan, placement, reason = make_train_plan(state, JOB, 100.0, epoch=1, start_step=0)
    assert plan is not None and placement is not None, reason
    assert len(plan.stages) == 2 and plan.n_replicas == 2
    assert plan.stages[0].first_layer == 0 and plan.stages[-1].last_layer == 4
    placed = {p for st in plan.stages for p in st.peers}
    assert len(placed) == 4 and {s.peer_id for s in plan.spares} == set(pids) - placed
    assert all(st.trees and abs(sum(t.share for t in st.trees) - 1) < 1e-6 for st in plan.stages)
    assert "no measured links" in reason and plan.predicted_step_s > 0


def test_peer_without_memory_for_a_layer_is_a_spare_told_why():
    pids = ids(5)
    peers = {p: peer(p) for p in pids[:4]} | {pids[4]: peer(pids[4], memory=1 << 10)}
    plan, _, _ = make_train_plan(SwarmState("s", 100.0, peers), JOB, 100.0, epoch=1, start_step=0)
    assert plan is not None
    spare = {s.peer_id: s.reason for s in plan.spares}
    assert "too little memory" in spare[pids[4]] and "one layer needs" in spare[pids[4]]


def test_waits_for_min_peers_and_uses_measured_links():
    pids = ids(4)
    plan, _, reason = make_train_plan(
        SwarmState("s", 100.0, {p: peer(p) for p in pids[:3]}), JOB, 100.0, 1, 0
    )
    assert plan is None and "waiting for peers: 3 usable of the 4" in reason
    links = {
        a: LinkReport(
            peer_id=a,
            issued_at=100.0,
            links=[LinkSample(dst=b, rtt_ms=1.0, bandwidth_gbps=5.0) for b in pids if b != a],
        )
        for a in pids
    }
    state = SwarmState("s", 100.0, {p: peer(p) for p in pids}, links)
    plan, _, reason = make_train_plan(state, JOB, 100.0, epoch=3, start_step=40)
    assert plan is not None and plan.epoch == 3 and plan.start_step == 40
    assert "12 measured links" in reason


def test_codec_choice_reaches_the_step_model():
    packed = step_job(JOB)
    raw = step_job(
        JOB.model_copy(
            update={
                "compression": JOB.compression.model_copy(update={"activations": "none", "gradients": "none"})
            }
        )
    )
    assert packed.codecs.activation_wan < raw.codecs.activation_wan


# No forced shape: the planner picks one from the peers it has (as examples/tiny.toml does).
FREE = JOB.model_copy(update={"limits": JOB.limits.model_copy(update={"stages": None, "replicas": None})})


def four_needed_bytes() -> int:
    """Device memory with which three peers cannot hold FREE's 4 layers and four can."""
    return memory_for(step_job(FREE), 4)


def test_a_running_job_replans_below_min_peers_when_the_peers_hold_the_model():
    """min_peers is the threshold to start; a job that lost a peer goes on with the three it has."""
    pids = ids(3)
    state = SwarmState("s", 100.0, {p: peer(p) for p in pids})
    plan, _, reason = make_train_plan(state, FREE, 100.0, epoch=1, start_step=0)
    assert plan is None and "waiting for peers: 3 usable of the 4" in reason  # not started yet
    plan, _, reason = make_train_plan(state, FREE, 100.0, epoch=2, start_step=50, running=True)
    assert plan is not None, reason
    assert plan.start_step == 50 and set(plan.peers) <= set(pids) and len(plan.peers) >= 1


def test_a_running_job_with_a_forced_width_trains_narrower_when_it_loses_a_replica():
    """replicas = 4 is the width to start with; at 3 live the job goes on 1 x 3 (issue 38's stall)."""
    job = JobSpec.model_validate({**FREE.model_dump(), "limits": {"stages": 1, "replicas": 4}})
    pids = ids(4)
    state = SwarmState("s", 100.0, {p: peer(p) for p in pids})
    plan, _, reason = make_train_plan(state, job, 100.0, epoch=1, start_step=0)
    assert plan is not None and plan.n_replicas == 4, reason
    state = SwarmState("s", 100.0, {p: peer(p) for p in pids[1:]})
    assert make_train_plan(state, job, 100.0, epoch=2, start_step=50)[0] is None  # not yet running
    plan, _, reason = make_train_plan(state, job, 100.0, epoch=2, start_step=50, running=True)
    assert plan is not None and plan.n_replicas == 3 and len(plan.stages) == 1, reason
    assert "4 replicas forced, 3 while 3 live" in reason


def test_a_running_job_short_of_memory_waits_and_says_how_many_peers_would_hold_it():
    pids = ids(3)
    mem = four_needed_bytes()
    state = SwarmState("s", 100.0, {p: peer(p, memory=mem) for p in pids})
    plan, _, reason = make_train_plan(state, FREE, 100.0, epoch=2, start_step=50, running=True)
    assert plan is None and reason == "waiting for peers: 3 live, 4 needed to hold the model"
    fourth = ids(1)[0]
    state = SwarmState("s", 100.0, {p: peer(p, memory=mem) for p in [*pids, fourth]})
    plan, _, reason = make_train_plan(state, FREE, 100.0, epoch=2, start_step=50, running=True)
    assert plan is not None and len(plan.stages) == 4, reason


def test_peers_to_hold_counts_the_largest_memories_first_and_extrapolates_past_the_live_ones():
    sj = step_job(FREE)
    mem_gb = four_needed_bytes() / 1e9
    assert peers_to_hold(sj, [mem_gb] * 3) == 4  # one more like them
    assert peers_to_hold(sj, [64.0, mem_gb, mem_gb]) == 1  # the big one holds everything
    assert peers_to_hold(sj, []) is None
    assert peers_to_hold(sj, [mem_gb / 100]) is None  # not even a layer each, however many


def test_the_predicted_step_ends_with_the_commit_round_trip_to_the_leader():
    """Every step ends with READY to the plan's leader and its decision back (peer/train/commit.py): the
    model adds the farthest placed peer's round trip to the leader on top of the pipeline and the sync."""
    from potluck.coordinator.job.plan import DEFAULT_RTT_MS, network, predict_step
    from potluck.coordinator.placement.costmodel import DeviceSpec

    pids = ids(4)
    state = SwarmState("s", 100.0, {p: peer(p) for p in pids})
    plan, _, _ = make_train_plan(state, JOB, 100.0, epoch=1, start_step=0)
    assert plan is not None
    order = sorted(pids)
    net, _ = network(state, order)  # no measured links: DEFAULT_RTT_MS between every two peers
    devices = {p: DeviceSpec(tflops=0.1, memory_gb=8.0) for p in order}
    br = predict_step(plan, JOB, devices, net, order)
    assert br.commit == DEFAULT_RTT_MS / 1e3
    assert br.total == br.pipeline + br.dp_exposed + br.commit
    assert plan.predicted_step_s == br.total


def test_measured_message_costs_price_each_boundary_under_load():
    """The probe measures idle links; under load a pipeline message also pays its codec and a busy
    peer's delays. What the peers measured (``StepTiming.round_trip`` upstream less ``.hold``
    downstream, halved) replaces a boundary's link time where it is larger, and 1F1B pays it per
    micro-batch: on two stages holding one micro-batch ahead, about half the round trip each slot."""
    from potluck.coordinator.job.plan import DEFAULT_RTT_MS, message_costs, network, predict_step
    from potluck.coordinator.placement.costmodel import DeviceSpec

    pids = ids(4)
    state = SwarmState("s", 100.0, {p: peer(p) for p in pids})
    plan, _, _ = make_train_plan(state, JOB, 100.0, epoch=1, start_step=0)
    assert plan is not None and len(plan.stages) == 2
    up, down = plan.stages[0].peers, plan.stages[1].peers
    round_trip = {p: 0.375 for p in up} | {p: 0.0 for p in down}
    hold = {p: 0.25 for p in down} | {p: 0.0 for p in up}
    messages = message_costs(plan, round_trip, hold)
    assert messages == {(a, b): 0.0625 for a, b in zip(up, down, strict=True)}
    order = sorted(pids)
    net, _ = network(state, order)
    devices = {p: DeviceSpec(tflops=0.1, memory_gb=8.0) for p in order}
    idle = predict_step(plan, JOB, devices, net, order)
    busy = predict_step(plan, JOB, devices, net, order, messages=messages)
    # all of it but what waiting behind stage 0's other micro-batches in flight on the link explains
    assert idle.link[0] < 0.06 < busy.link[0] <= 0.0625
    window = 2 + plan.run_ahead  # micro-batches stage 0 keeps in flight
    extra = (busy.micro_batches - 1) * 2 * (busy.link[0] - idle.link[0]) / window
    assert busy.pipeline >= idle.pipeline + 0.9 * extra
    # a peer that measured nothing (or a smaller figure than the links') leaves the model as it was
    assert predict_step(plan, JOB, devices, net, order, messages={}).total == idle.total
    small = {k: 1e-6 for k in messages}
    assert predict_step(plan, JOB, devices, net, order, messages=small).total == idle.total
    # a figure the wait behind the other micro-batches in flight explains is the bandwidth's, priced
    transfer = idle.link[0] - DEFAULT_RTT_MS / 2e3  # the links' bandwidth part of a message
    queued = idle.link[0] + (window - 1) * transfer
    assert transfer > 0
    explained = {k: 0.99 * queued for k in messages}
    assert predict_step(plan, JOB, devices, net, order, messages=explained).total == idle.total
    beyond = {k: 1.01 * queued for k in messages}
    assert predict_step(plan, JOB, devices, net, order, messages=beyond).total > idle.total
