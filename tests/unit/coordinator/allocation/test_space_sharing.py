"""Space sharing on a live swarm: a shared device is two peers (its own and a co-tenant) whose records
name each other; the allocator counts the device once, prices a pair of jobs on it from the measured
pair speedup until the pair's rates are measured, and leases a shared row to the device's own peer and
its co-tenant (``Lease.partners``), one job each."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from potluck.coordinator.allocation import (
    AllocConfig,
    JobDemand,
    PeerInfo,
    RateEstimate,
    allocate,
    estimate,
    group,
    is_cotenant,
    pair_prior,
    shared_devices,
)
from potluck.coordinator.job.lease import leased_state
from potluck.coordinator.state import SwarmState
from potluck.peer.lease import HOME, leased_job
from potluck.protocol.allocation import Allocation, Lease
from potluck.protocol.identity import Identity
from potluck.protocol.keys import JobKeys
from tests.unit.coordinator.job.test_lease import allocation
from tests.unit.protocol.conftest import NOW, make_hardware, make_job, make_peer_record
from tests.unit.protocol.test_membership import verified

HOSTS = [Identity.generate() for _ in range(2)]
GUESTS = [Identity.generate() for _ in range(2)]
H = [i.peer_id for i in HOSTS]
G = [i.peer_id for i in GUESTS]


def records(speedup: float | None = 1.6) -> dict:
    """Two shared devices: H[k] names G[k] as its co-tenant and G[k] names H[k] back."""
    hw = make_hardware(pair_speedup=speedup)
    out = {
        h.peer_id: make_peer_record(h, hardware=hw, cotenant=g.peer_id)
        for h, g in zip(HOSTS, GUESTS, strict=True)
    }
    out |= {
        g.peer_id: make_peer_record(g, hardware=hw, cotenant_of=h.peer_id)
        for h, g in zip(HOSTS, GUESTS, strict=True)
    }
    return out


def workers(recs: dict) -> list[PeerInfo]:
    """What the allocator builds from the live records (coordinator/allocator.py), in one class."""
    shared = shared_devices(recs)
    out = []
    for p, r in sorted(recs.items()):
        if not is_cotenant(r):
            info = PeerInfo.from_record(r, cotenant=shared.get(p))
            out.append(PeerInfo(p, info.hardware, None, info.shareable, "cpu", info.cotenant))
    return out


def test_the_records_name_each_other_and_say_nothing_when_not_shared():
    plain = make_peer_record(HOSTS[0])
    assert "cotenant" not in plain.model_dump(mode="json")  # an unshared record is signed as before
    assert b"cotenant" not in plain.canonical_bytes()
    shared = records()[H[0]]
    assert shared.cotenant == G[0] and b'"cotenant":"' in shared.canonical_bytes()
    with pytest.raises(ValidationError, match="not both"):
        make_peer_record(HOSTS[0], cotenant=G[0], cotenant_of=G[1])
    with pytest.raises(ValidationError, match="its own co-tenant"):
        make_peer_record(HOSTS[0], cotenant=H[0])


def test_a_device_is_shared_only_when_both_records_say_so():
    recs = records()
    assert shared_devices(recs) == {H[0]: G[0], H[1]: G[1]}
    # a peer naming a co-tenant that does not name it back (or is not live) shares nothing
    recs[H[0]] = make_peer_record(HOSTS[0], cotenant=G[1])
    del recs[G[1]]
    assert shared_devices(recs) == {}
    # ... and a co-tenant is never a worker of its own, named back or not
    peers = workers(recs)
    assert [p.peer_id for p in peers] == sorted(H) and not any(p.shareable for p in peers)


def test_pair_rates_start_from_the_measured_pair_speedup_then_follow_what_is_measured():
    spec = make_job(name="a")
    classes = group(workers(records(speedup=1.6)))
    (name,) = classes
    assert classes[name].workers == 2 and classes[name].shareable and classes[name].pair_speedup == 1.6
    tp = estimate({"a": (spec, 2), "b": (spec.model_copy(update={"name": "b"}), 2)}, classes, {})
    alone = tp.single[("a", name)]
    assert tp.paired[("a", "b", name)] == pytest.approx((alone * 0.8, alone * 0.8))
    measured = {("a", ("a", "b"), name): RateEstimate(0.25, 3)}
    tp = estimate({"a": (spec, 2), "b": (spec, 2)}, classes, {}, measured_pairs=measured)
    assert tp.paired[("a", "b", name)] == pytest.approx((0.25, alone * 0.8))
    # measured only in the pair: alone, a runs at that rate over its share of the speedup, not the prior
    assert tp.single[("a", name)] == pytest.approx(0.25 / 0.8)
    assert pair_prior(2.0, 1.0, fits=False, pair_speedup=1.9) == (0.0, 0.0)  # two states do not fit
    assert pair_prior(2.0, 1.0, fits=True, pair_speedup=None) == (1.0, 0.5)  # unmeasured: a tie


@pytest.mark.parametrize(("speedup", "shared"), [(1.6, True), (0.9, False)])
def test_two_jobs_on_too_few_devices_share_them_when_the_pair_speedup_pays(speedup, shared):
    """Two jobs of two peers each, two shared devices: time slicing gives each half the time; sharing
    gives each speedup / 2 of its rate alone, all the time. The device's own peer serves the first job,
    its co-tenant the second."""
    spec = make_job(name="a", min_peers=2)
    peers = workers(records(speedup))
    classes = group(peers)
    tp = estimate({"a": (spec, 2), "b": (spec, 2)}, classes, {})
    jobs = [JobDemand("a", scale=2), JobDemand("b", scale=2)]
    # the devices' own peers train a already (its running plan): sharing moves none of them
    alloc, reason = allocate(
        NOW, jobs, peers, tp, AllocConfig(round_s=60.0), incumbents=dict.fromkeys(H, "a")
    )
    (lease,) = alloc.leases
    if not shared:
        assert len(lease.jobs) == 1 and not lease.partners
        return
    assert lease.jobs == ["a", "b"] and lease.peers == sorted(H) and "0 peers moved" in reason
    assert lease.partners == [dict(zip(H, G, strict=True))[h] for h in lease.peers]
    assert sorted(alloc.peers_of("a")) == sorted(H) and sorted(alloc.peers_of("b")) == sorted(G)
    assert alloc.assignment()[G[0]] == ("b",)
    # a co-tenant that dies mid-round takes its device out of the pair lease; the rest runs on
    recs = records(speedup)
    del recs[G[1]]
    later, _ = allocate(NOW + 10, jobs, workers(recs), tp, AllocConfig(round_s=60.0), alloc)
    pair = next(x for x in later.leases if len(x.jobs) == 2)
    kept = dict(zip(H, G, strict=True))
    assert [kept[p] for p in pair.peers] == pair.partners and G[1] not in pair.partners


def lease_record(leases: list[Lease]) -> Allocation:
    return allocation(leases, jobs="abc")


def test_partners_are_checked_where_the_record_is_read():
    ok = Lease(jobs=["a", "b"], peer_class="cpu", peers=[H[0]], partners=[G[0]])
    assert ok.serving() == {H[0]: ("a",), G[0]: ("b",)}
    assert "partners" not in Lease(jobs=["a"], peer_class="cpu", peers=[H[0]]).model_dump(mode="json")
    with pytest.raises(ValidationError, match="one per peer"):
        Lease(jobs=["a"], peer_class="cpu", peers=[H[0]], partners=[G[0]])
    with pytest.raises(ValidationError, match="one per peer"):
        Lease(jobs=["a", "b"], peer_class="cpu", peers=H, partners=[G[0]])
    with pytest.raises(ValidationError, match="twice"):
        Lease(jobs=["a", "b"], peer_class="cpu", peers=[H[0]], partners=[H[0]])
    with pytest.raises(ValidationError, match="two leases"):  # a partner leased elsewhere too
        lease_record([ok, Lease(jobs=["c"], peer_class="cpu", peers=[G[0]])])


def test_a_cotenant_serves_only_what_a_lease_names_it_for():
    alloc = lease_record([Lease(jobs=["a", "b"], peer_class="cpu", peers=[H[0]], partners=[G[0]])])
    assert leased_job(None, G[0], None, cotenant=True) is None  # no allocation: the device is its host's
    assert leased_job(None, H[0], None) == HOME
    assert leased_job(alloc, G[0], "a", cotenant=True) == JobKeys("b", home=False)
    assert leased_job(alloc, H[0], "a") == HOME
    # the swarm's own job, without an allocation, plans over every peer but the co-tenants
    recs = records()
    swarm = SwarmState.from_records(
        "s", [verified(i, NOW + 10, **_kw(recs[i.peer_id])) for i in HOSTS + GUESTS], [], NOW
    )
    assert set(leased_state(swarm, None, "a", None).peers) == set(H)
    assert set(leased_state(swarm, alloc, "b", None, home=False).peers) == {G[0]}


def _kw(record) -> dict:
    return {"cotenant": record.cotenant, "cotenant_of": record.cotenant_of}


def test_the_simulator_runs_pairs_at_gavels_co_located_rates(gavel):
    """An oversubscribed cluster of shareable workers: pairs of single-worker jobs are leased and make
    progress at their measured co-located rates; every job still finishes."""
    import numpy as np

    from potluck.sim.cluster import cluster, poisson_trace, simulate

    trace = poisson_trace(np.random.default_rng(0), gavel, 6, 20.0)
    cfg = AllocConfig(policy="las", round_s=3600.0, handoff_s=30.0)
    shared = simulate(trace, gavel, cluster({"k80": 1, "p100": 1, "v100": 1}, shareable=True), cfg)
    alone = simulate(trace, gavel, cluster({"k80": 1, "p100": 1, "v100": 1}), cfg)
    assert len(shared.jct) == len(alone.jct) == 6
    assert shared.shared_rounds > 0 and alone.shared_rounds == 0
    assert shared.jct != alone.jct
