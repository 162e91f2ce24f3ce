"""Per-link activation codecs, decided by the coordinator (issue 22): which chain each direction of each
boundary link carries, the cost model pricing every link at its own chain, and measured ratios from the
peers' progress records replacing the codec library's estimate."""

import numpy as np
import pytest

from potluck.compression.errors import SpecError
from potluck.coordinator.job.codecs import (
    MeasuredRatios,
    canonical_chain,
    chain_problems,
    codec_ratios,
    estimated_ratio,
    measured_chain_ratios,
    select_link_codecs,
)
from potluck.coordinator.job.improve import ImproveConfig, evaluate_join, predicted_step_s
from potluck.coordinator.job.joins import JoinDesk
from potluck.coordinator.job.plan import make_train_plan, network, step_job
from potluck.coordinator.placement.costmodel import directed_bandwidth, link_weight
from potluck.coordinator.placement.netmodel import from_matrices
from potluck.coordinator.state import SwarmState
from potluck.protocol.jobspec import CompressionSpec
from potluck.protocol.records import LinkReport, LinkSample
from potluck.protocol.training import LinkCodecs, Progress, StageAssignment, TrainPlan
from tests.unit.coordinator.job.test_plan import JOB, ids, peer

# The job default "int8:block=64" as the codecs spell it in their headers (and the plan): block=64 is
# int8's default, so its canonical spec is plain "int8".
FAST, SLOW = canonical_chain("int8:block=64"), "int4:block=32|zstd"
SELECTIVE = CompressionSpec(activations="int8:block=64", activations_slow=SLOW, slow_link_gbps=1.0)


def rows(forward: list[list[str]], backward: list[list[str]]) -> LinkCodecs:
    """A plan's link codecs from chains written out per link (boundary rows, one chain per replica)."""
    chains = sorted({c for row in (*forward, *backward) for c in row})
    index = {c: k for k, c in enumerate(chains)}
    return LinkCodecs(
        chains=chains,
        forward=[[index[c] for c in row] for row in forward],
        backward=[[index[c] for c in row] for row in backward],
    )


def four_peers(upload_1: float = 0.5):
    """Peers 0..3, 5 Gbit/s pairs, 1 ms; peer 1 uploads at ``upload_1`` Gbit/s (a home uplink)."""
    lat = np.full((4, 4), 1.0)
    bw = np.full((4, 4), 5.0)
    np.fill_diagonal(lat, 0.0)
    return from_matrices(lat, bw, [10.0, upload_1, 10.0, 10.0], [10.0] * 4)


def test_slow_directions_get_the_slow_chain_and_fast_ones_keep_the_job_chain():
    links = select_link_codecs([[0, 1], [2, 3]], four_peers(), SELECTIVE)
    # 1 -> 3 runs over peer 1's 0.5 Gbit/s uplink; 3 -> 1 (the gradients) is fast
    assert links == LinkCodecs(chains=[FAST, SLOW], forward=[[0, 1]], backward=[[0, 0]])
    # replica 1 has it the other way round when it sits on the receiving side
    assert select_link_codecs([[2, 3], [0, 1]], four_peers(), SELECTIVE) == LinkCodecs(
        chains=[FAST, SLOW], forward=[[0, 0]], backward=[[0, 1]]
    )


def test_no_slow_chain_no_slow_link_or_one_stage_leaves_the_plan_without_link_codecs():
    assert select_link_codecs([[0, 1], [2, 3]], four_peers(), CompressionSpec()) is None
    assert select_link_codecs([[0, 1], [2, 3]], four_peers(upload_1=5.0), SELECTIVE) is None
    assert select_link_codecs([[0, 1, 2, 3]], four_peers(), SELECTIVE) is None
    same = SELECTIVE.model_copy(update={"activations_slow": FAST})
    assert select_link_codecs([[0, 1], [2, 3]], four_peers(), same) is None


def test_a_slow_chain_the_codecs_cannot_build_is_an_error():
    bad = SELECTIVE.model_copy(update={"activations_slow": "int9"})
    with pytest.raises(SpecError):
        select_link_codecs([[0, 1], [2, 3]], four_peers(), bad)


def test_the_cost_model_prices_each_direction_at_its_chain():
    net = four_peers()
    plain, selective = step_job(JOB), step_job(JOB.model_copy(update={"compression": SELECTIVE}))
    assert selective.codecs.lan_gbps == 1.0
    assert selective.codecs.activation_wan == pytest.approx(estimated_ratio(SLOW))
    assert (
        selective.codecs.activation_lan == plain.codecs.activation_lan == pytest.approx(estimated_ratio(FAST))
    )
    w_plain, w_sel = link_weight(net, plain), link_weight(net, selective)
    # the pair (1, 3) is priced by its slow direction, now carrying the smaller chain
    assert w_sel[1, 3] < w_plain[1, 3]
    bw = directed_bandwidth(net)
    one_way = 1e-3 + 2.0 * 2 * 32 * 64 * estimated_ratio(SLOW) * 8.0 / (bw[1, 3] * 1e9)
    assert w_sel[1, 3] == pytest.approx(one_way)
    # fast pairs are unchanged
    assert w_sel[0, 2] == pytest.approx(w_plain[0, 2])


def test_measured_ratios_replace_the_estimate_and_implausible_ones_are_ignored():
    comp = CompressionSpec()
    assert codec_ratios(comp, {FAST: 4.0}).activation_lan == pytest.approx(0.5)  # 2 / 4
    assert codec_ratios(comp, {FAST: 0.01}).activation_lan == pytest.approx(estimated_ratio(FAST))
    assert codec_ratios(comp, {"int4": 8.0}).activation_lan == pytest.approx(estimated_ratio(FAST))
    sj = step_job(JOB, {FAST: 8.0})
    assert sj.codecs.activation_lan == sj.codecs.activation_wan == pytest.approx(0.25)


def three_stage_plan(pids: list[str]) -> TrainPlan:
    stages = [
        StageAssignment(first_layer=j, last_layer=j + 1, peers=pids[2 * j : 2 * j + 2]) for j in range(3)
    ]
    links = rows([[FAST, SLOW], [FAST, FAST]], [[FAST, SLOW], [FAST, SLOW]])
    return TrainPlan(
        job="t", epoch=2, start_step=0, stages=stages, micro_batches=2, link_codecs=links, issued_at=1.0
    )


def report(pid: str, stage: int, replica: int, ratio: float | None, epoch: int = 2) -> Progress:
    return Progress(
        peer_id=pid,
        job="t",
        epoch=epoch,
        stage=stage,
        replica=replica,
        step=5,
        activation_ratio=ratio,
        issued_at=1.0,
    )


def test_measured_chain_ratios_attribute_each_peer_to_the_one_chain_it_sends_with():
    pids = ids(6)
    p = three_stage_plan(pids)
    records = [
        report(pids[0], 0, 0, 4.0),  # sends FAST only
        report(pids[1], 0, 1, 9.0),  # sends SLOW only
        report(pids[2], 1, 0, 3.0),  # FAST on to stage 2, FAST back: FAST
        report(pids[3], 1, 1, 6.0),  # FAST on, SLOW back: a mix, left out
        report(pids[4], 2, 0, 5.0),  # FAST back
        report(pids[5], 2, 1, 7.0),  # SLOW back
        report(pids[0], 0, 0, 100.0, epoch=1),  # an older epoch's links
        report(pids[1], 0, 0, 100.0),  # not where the plan placed it
        report(pids[2], 1, 0, None),  # unmeasured
    ]
    assert measured_chain_ratios(p, JOB, records) == {FAST: 4.0, SLOW: 8.0}


def slow_swarm(n: int, gbps: float) -> SwarmState:
    pids = ids(n)
    links = {
        a: LinkReport(
            peer_id=a,
            issued_at=100.0,
            links=[LinkSample(dst=b, rtt_ms=20.0, bandwidth_gbps=gbps) for b in pids if b != a],
        )
        for a in pids
    }
    return SwarmState("s", 100.0, {p: peer(p) for p in pids}, links)


@pytest.mark.slow  # three plans, each a 2 s search
def test_the_coordinator_signs_each_links_chain_into_the_plan():
    state = slow_swarm(4, 0.5)
    job = JOB.model_copy(update={"compression": SELECTIVE})
    plan, _, reason = make_train_plan(state, job, 100.0, epoch=1, start_step=0)
    assert plan is not None and plan.link_codecs is not None, reason
    assert [plan.link_chain(0, i, False, "?") for i in range(2)] == [SLOW, SLOW]
    assert TrainPlan.model_validate_json(plan.canonical_bytes()) == plan
    # every chain follows the directed bandwidth of its link in the coordinator's own network model
    usable = sorted(state.peers)
    net, _ = network(state, usable)
    bw, ix = directed_bandwidth(net), {p: i for i, p in enumerate(usable)}
    for i, (a, b) in enumerate(zip(plan.stages[0].peers, plan.stages[1].peers, strict=True)):
        assert (plan.link_chain(0, i, False, "?") == SLOW) == (bw[ix[a], ix[b]] < 1.0)
        assert (plan.link_chain(0, i, True, "?") == SLOW) == (bw[ix[b], ix[a]] < 1.0)
    # links above the threshold, or a job without a slow chain: the plan is written as before
    fast = job.model_copy(update={"compression": SELECTIVE.model_copy(update={"slow_link_gbps": 0.1})})
    assert make_train_plan(state, fast, 100.0, 1, 0)[0].link_codecs is None
    assert make_train_plan(state, JOB, 100.0, 1, 0)[0].link_codecs is None


def test_measured_ratios_are_kept_across_plans_and_replaced_by_newer_ones():
    pids = ids(6)
    ratios = MeasuredRatios()
    assert ratios.update(None, JOB, []) == {}
    first = three_stage_plan(pids)
    assert ratios.update(first, JOB, [report(pids[0], 0, 0, 4.0), report(pids[1], 0, 1, 9.0)]) == {
        FAST: 4.0,
        SLOW: 9.0,
    }
    # the next epoch: no report yet keeps what was measured; a new report of one chain replaces it
    second = first.model_copy(update={"epoch": 3})
    assert ratios.update(second, JOB, []) == {FAST: 4.0, SLOW: 9.0}
    assert ratios.update(second, JOB, [report(pids[0], 0, 0, 5.0, epoch=3)]) == {FAST: 5.0, SLOW: 9.0}


def test_a_bottleneck_prices_its_cuts_at_rank_over_width_until_measured():
    comp = CompressionSpec(activations=FAST)
    narrow = codec_ratios(comp, None, width=0.125)  # rank 16 of d_model 128
    assert narrow.activation_lan == pytest.approx(estimated_ratio(FAST) / 8)
    # a measured ratio counts d_model-wide hidden states already: taken as it is
    assert codec_ratios(comp, {FAST: 64.0}, width=0.125).activation_lan == pytest.approx(2 / 64)


def test_chain_problems_name_each_field_whose_chain_cannot_be_built():
    assert chain_problems(CompressionSpec()) == []
    bad = CompressionSpec(activations="int8|nope", sync_every=4, outer="int2:block=32|zstd", gradients="int3")
    problems = chain_problems(bad)
    assert [p.split(" =")[0] for p in problems] == ["compression.activations", "compression.gradients"]


def test_local_steps_and_a_coded_outer_sync_price_the_replica_sync_per_step():
    every = codec_ratios(CompressionSpec(gradients="int8"))
    assert every.gradient_wan == pytest.approx(estimated_ratio("int8"))
    local = codec_ratios(CompressionSpec(gradients="int8", sync_every=8))
    assert local.gradient_wan == pytest.approx(estimated_ratio("int8") / 8)
    coded = codec_ratios(CompressionSpec(gradients="int8", sync_every=8, outer="int2:block=32|zstd"))
    assert coded.gradient_wan == pytest.approx(estimated_ratio("int2:block=32|zstd") / 8)
    assert coded.gradient_wan < local.gradient_wan


@pytest.mark.slow  # a plan and three join offers, each a 2 s search
def test_a_join_offer_prices_the_links_at_the_measured_ratios():
    """Pricing a newcomer uses what the peers measured, as the re-plan itself will: a chain measured at
    8x its estimate makes the slow links, and so the running plan's predicted step, cheaper."""
    state = slow_swarm(5, 0.05)
    job = JOB.model_copy(update={"min_peers": 4, "limits": JOB.limits.model_copy(update={"replicas": None})})
    running, _, reason = make_train_plan(state.without([ids(5)[4]]), job, 100.0, epoch=1, start_step=0)
    assert running is not None, reason
    newcomer = [ids(5)[4]]
    estimated = evaluate_join(state, job, running, 10, {}, newcomer, 100.0)
    measured = {FAST: 8 * estimated_ratio(FAST)}
    priced = evaluate_join(state, job, running, 10, {}, newcomer, 100.0, measured_ratios=measured)
    assert priced.offer.current_s < estimated.offer.current_s
    assert priced.offer.current_s == pytest.approx(predicted_step_s(running, job, state, {}, measured))
    desk = JoinDesk(10.0, 60.0, ImproveConfig())
    _, _, ev = desk.evaluate(state, job, running, 10, {}, newcomer, 100.0, 0.0, 0.0, measured)
    assert ev.offer.current_s == pytest.approx(priced.offer.current_s)
