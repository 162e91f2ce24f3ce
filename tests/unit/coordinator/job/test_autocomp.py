"""compression = "auto" (issue 38, item 2): a job file without [compression] lets the coordinator choose
per plan from the measured links; fast links get the most faithful setting, slow home links the
compressed rungs the benchmarks proved; a job that names its settings keeps them."""

import pytest

from potluck.coordinator.job.autocomp import (
    LOCAL_STEPS_GAIN,
    TOLERANCE,
    Rung,
    allowed,
    choose,
    ladder,
)
from potluck.coordinator.job.plan import make_train_plan
from potluck.coordinator.state import SwarmState
from potluck.protocol.errors import JobSpecError
from potluck.protocol.jobspec import CompressionSpec, parse_job
from potluck.protocol.records import LinkReport, LinkSample
from tests.unit.coordinator.job.test_plan import ids, peer

DEMO = {
    "name": "auto",
    "min_peers": 4,
    "model": {"n_layers": 4, "d_model": 128, "n_heads": 4, "vocab_size": 256, "seq_len": 64},
    "batch": {"tokens_per_step": 8192, "micro_batch_size": 4},
    "limits": {"stages": 2, "replicas": 2},
}


def test_a_job_file_without_compression_asks_for_auto_and_one_with_a_section_keeps_it():
    assert parse_job(DEMO).compression.auto
    assert parse_job({**DEMO, "compression": "auto"}).compression.auto
    named = parse_job({**DEMO, "compression": {"activations": "int4:block=64"}}).compression
    assert not named.auto and named.activations == "int4:block=64"
    with pytest.raises(JobSpecError, match="chooses every setting itself; remove sync_every"):
        parse_job({**DEMO, "compression": {"auto": True, "sync_every": 4}})
    # left out of the signed job when false: a job with its own section signs as it always did
    assert b'"auto":' not in parse_job({**DEMO, "compression": {}}).canonical_bytes()
    assert b'"auto":true' in parse_job(DEMO).canonical_bytes()


def test_the_most_faithful_rung_within_the_tolerance_of_the_fastest_wins():
    rungs = ladder()
    assert [r.spec.sync_every for r in rungs] == [1, 1, 1, 4, 16]
    fast = [(r, 1.0) for r in rungs]  # links hide everything: nothing is worth compressing
    assert choose(fast)[0].name == "lossless"
    home = list(zip(rungs, [9.0, 3.0, 1.5, 1.0, 0.95], strict=True))
    rung, why = choose(home)
    assert rung.spec.sync_every == 4 and TOLERANCE * 0.95 >= 1.0  # H16 is not 10% faster than H4
    assert why.startswith("compression auto: int8, int4 under 1 Gbit/s, 4 local steps (1 s a step")
    assert "lossless 9 s" in why
    # local steps 20% faster than the best rung without: not worth changing the optimisation for
    near = list(zip(rungs, [1.5, 1.2, 1.2, 1.0, 1.0], strict=True))
    assert choose(near)[0].name == "int8" and LOCAL_STEPS_GAIN * 1.0 > 1.2


def test_rungs_the_jobs_other_sections_rule_out_are_skipped():
    deadline = parse_job({**DEMO, "sync": {"policy": "deadline"}})
    names = [r.name for r in allowed(deadline, ladder())]
    assert not any(n.endswith("4 local steps") for n in names)  # local steps need a coded outer sync
    assert names[-1].endswith("2-bit outer")
    clip = parse_job({**DEMO, "trust": {"aggregation": "centered_clip"}})
    assert not any("outer" in r.name for r in allowed(clip, ladder()))
    assert all(isinstance(r, Rung) for r in allowed(clip, ladder()))


def swarm(gbps: float) -> SwarmState:
    pids = ids(4)
    links = {
        a: LinkReport(
            peer_id=a,
            issued_at=100.0,
            links=[
                LinkSample(dst=b, rtt_ms=40.0 if gbps < 1 else 0.2, bandwidth_gbps=gbps)
                for b in pids
                if b != a
            ],
        )
        for a in pids
    }
    return SwarmState("s", 100.0, {p: peer(p, tflops=0.5) for p in pids}, links)


@pytest.mark.slow  # three planner searches of seconds each
def test_fast_links_get_lossless_and_home_links_a_compressed_rung_signed_into_the_plan():
    job = parse_job(DEMO)
    plan, _, reason = make_train_plan(swarm(100.0), job, 100.0, epoch=1, start_step=0)
    assert plan is not None and plan.compression is not None, reason
    assert plan.compression.activations == "none" and not plan.compression.auto
    assert "compression auto: lossless" in reason
    # the same plan on 1 Gbit/s links: lossless would cost host CPU per byte the model does not count
    plan, _, reason = make_train_plan(swarm(1.0), job, 100.0, epoch=1, start_step=0)
    assert plan is not None and plan.compression is not None and plan.compression.activations != "none"
    assert "lossless" not in reason
    plan, _, reason = make_train_plan(swarm(0.006), job, 100.0, epoch=1, start_step=0)
    assert plan is not None and plan.compression is not None, reason
    assert plan.compression.activations_slow == "int4:block=64" or plan.compression.sync_every > 1, reason
    assert plan.under(job).compression == plan.compression  # what every peer trains with
    # a running job keeps its first plan's choice (local steps and outer momentum are replica state)
    kept = CompressionSpec(sync_every=4)
    again, _, reason = make_train_plan(swarm(100.0), job, 100.0, 2, 50, running=True, keep_compression=kept)
    assert again is not None and again.compression == kept and "as the job's first plan chose" in reason


def test_a_job_with_its_own_section_is_planned_with_it_and_the_plan_names_no_compression():
    job = parse_job({**DEMO, "compression": {"activations": "int8:block=64"}})
    plan, _, _ = make_train_plan(swarm(0.006), job, 100.0, epoch=1, start_step=0)
    assert plan is not None and plan.compression is None and plan.under(job) is job
    assert b'"compression"' not in plan.canonical_bytes()
