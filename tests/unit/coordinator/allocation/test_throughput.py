"""Peer classes, the cost-model prior, measured rates and the churn discount."""

from __future__ import annotations

import pytest

from potluck.coordinator.allocation import (
    ChurnStats,
    PeerInfo,
    churn_discount,
    classify,
    estimate,
    group,
    observe,
    prior_rate,
    watch_churn,
)
from potluck.coordinator.allocation.classes import ClassProfile
from potluck.coordinator.allocation.throughput import MAX_WATCH_GAP_S
from potluck.protocol.jobspec import JobSpec
from potluck.protocol.records import Hardware

GIB = 1 << 30


def hw(name="NVIDIA GeForce RTX 3090", tflops=30.0, mem_gib=24):
    return Hardware(
        device_kind="cuda",
        device_name=name,
        memory_total_bytes=mem_gib * GIB,
        memory_free_bytes=mem_gib * GIB,
        cpu_cores=8,
        tflops_fp32=tflops,
        tflops_bf16=2 * tflops,
    )


def job(layers=8, d=512):
    return JobSpec(
        name="j",
        model={"n_layers": layers, "d_model": d, "n_heads": 8, "vocab_size": 256, "seq_len": 128},
        batch={"tokens_per_step": 128 * 32, "micro_batch_size": 4},
    )


def test_classes_group_alike_peers_and_split_tiers():
    a = PeerInfo("p1", hw(tflops=30.0), uplink_gbps=0.05)
    b = PeerInfo("p2", hw(tflops=31.0), uplink_gbps=0.08)  # same half-octave, same decade of Mbit/s
    slow = PeerInfo("p3", hw(tflops=12.0), uplink_gbps=0.05)
    lan = PeerInfo("p4", hw(tflops=30.0), uplink_gbps=5.0)
    assert classify(a) == classify(b) == "cuda:nvidia-geforce-rtx-3090/f9/m4/u1"
    assert len({classify(p) for p in (a, slow, lan)}) == 3
    classes = group([b, a, slow])
    prof = classes[classify(a)]
    assert prof.peers == ("p1", "p2") and prof.tflops == 30.0 and prof.uplink_gbps == 0.05
    assert classify(PeerInfo("p5", peer_class="v100")) == "v100"


def test_prior_follows_compute_memory_and_uplink():
    fast = ClassProfile("f", ("p",), tflops=40.0, memory_gb=24.0, uplink_gbps=1.0, shareable=False)
    slow = ClassProfile("s", ("p",), tflops=10.0, memory_gb=24.0, uplink_gbps=1.0, shareable=False)
    tiny = ClassProfile("t", ("p",), tflops=40.0, memory_gb=0.01, uplink_gbps=1.0, shareable=False)
    spec = job()
    assert prior_rate(spec, fast, 1) == pytest.approx(4 * prior_rate(spec, slow, 1))
    assert prior_rate(spec, tiny, 1) == 0.0  # the model's state does not fit
    thin = ClassProfile("u", ("p",), tflops=40.0, memory_gb=24.0, uplink_gbps=0.001, shareable=False)
    assert prior_rate(spec, thin, 2) < prior_rate(spec, fast, 2)  # activations cross a slow uplink


def test_measured_rates_replace_the_prior_and_follow_an_ema():
    est = observe(None, steps=10, seconds=10)
    assert est.rate == 1.0 and est.samples == 1
    est = observe(est, steps=20, seconds=10)
    assert est.rate == pytest.approx(1.3)
    cls = {"f": ClassProfile("f", ("p",), 40.0, 24.0, 1.0, False)}
    tp = estimate({"j": (job(), 1), "k": (job(), 1)}, cls, {("j", "f"): est})
    assert tp.single[("j", "f")] == pytest.approx(1.3)
    assert tp.single[("k", "f")] == pytest.approx(prior_rate(job(), cls["f"], 1))


def test_churn_discount_is_bounded_and_grows_with_departures():
    assert churn_discount(None, 60.0) == 1.0
    calm = churn_discount(ChurnStats(peer_s=36_000, departures=0), 60.0)
    flaky = churn_discount(ChurnStats(peer_s=36_000, departures=500), 60.0)
    assert calm == 1.0 and 0.0 < flaky < 0.9
    one = churn_discount(ChurnStats(peer_s=60, departures=1), 60.0)
    assert one > 0.99  # one leaver in a minute of watching is not yet a pattern


def test_watch_churn_counts_leavers_and_watched_time_per_class():
    before = {"a": "fast", "b": "fast", "c": "slow"}
    stats = watch_churn({}, before, {"a": "fast", "c": "slow", "d": "slow"}, 10.0)
    assert stats == {"fast": ChurnStats(20.0, 1), "slow": ChurnStats(10.0, 0)}  # b left; d is new
    stats = watch_churn(stats, {"a": "fast", "c": "slow"}, {"a": "slow", "c": "slow"}, 10.0)
    assert stats["fast"] == ChurnStats(30.0, 1)  # a changed class: not a departure
    stalled = watch_churn({}, {"a": "fast"}, {"a": "fast"}, 3600.0)
    assert stalled["fast"].peer_s == MAX_WATCH_GAP_S  # a stalled coordinator did not watch for an hour
    assert watch_churn({}, {"a": "fast"}, {}, -5.0)["fast"] == ChurnStats(0.0, 1)  # a clock step back


def test_a_churning_class_is_discounted_in_the_estimate():
    classes = group([PeerInfo("p1", hw(tflops=30.0)), PeerInfo("p2", hw(name="RTX 4090", tflops=80.0))])
    names = sorted(classes)
    calm = estimate({"j": (job(), 1)}, classes, {})
    churn = {names[0]: ChurnStats(peer_s=36_000.0, departures=1_200)}  # ten peers, one leaver in 30 s
    flaky = estimate({"j": (job(), 1)}, classes, {}, churn, recovery_s=30.0)
    lam = 1_200 / (36_000.0 + 6 * 3600.0)  # departures per peer-second, with six calm peer-hours as prior
    expected = calm.single[("j", names[0])] / (1.0 + lam * 30.0)
    assert (
        flaky.single[("j", names[0])] == pytest.approx(expected)
        and expected < 0.7 * calm.single[("j", names[0])]
    )
    assert flaky.single[("j", names[1])] == calm.single[("j", names[1])]
