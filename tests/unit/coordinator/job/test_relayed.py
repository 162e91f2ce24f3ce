"""Relayed links in planning: which pairs run through a relay, and plans that keep bulk off them."""

import numpy as np
import pytest

from potluck.coordinator.errors import NetModelError
from potluck.coordinator.job.claims import confirmed_links
from potluck.coordinator.job.plan import RELAYED_SLOWDOWN, make_train_plan, network, relayed_pairs
from potluck.coordinator.placement.netmodel import from_matrices, slow_pairs
from potluck.coordinator.state import SwarmState
from potluck.protocol.membership import PeerView
from potluck.protocol.records import LinkReport, LinkSample
from tests.unit.coordinator.job.test_plan import JOB, ids, peer


def natted(pid: str) -> PeerView:
    view = peer(pid)
    return PeerView(view.record.model_copy(update={"behind_nat": True}), view.expiration)


def uniform_links(
    pids: list[str], relayed: set[frozenset[str]] = frozenset(), relayed_gbps: float = 0.01
) -> dict[str, LinkReport]:
    def sample(a: str, b: str) -> LinkSample:
        hop = frozenset((a, b)) in relayed
        return LinkSample(dst=b, rtt_ms=20.0, bandwidth_gbps=relayed_gbps if hop else 0.01, relayed=hop)

    return {
        a: LinkReport(peer_id=a, issued_at=100.0, links=[sample(a, b) for b in pids if b != a]) for a in pids
    }


def bulk_pairs(plan) -> set[frozenset[str]]:
    """Pairs that exchange bulk data: replicas of a stage, and pipeline neighbours of a replica."""
    out = {frozenset((a, b)) for st in plan.stages for k, a in enumerate(st.peers) for b in st.peers[k + 1 :]}
    for s0, s1 in zip(plan.stages, plan.stages[1:], strict=False):
        out |= {frozenset(pair) for pair in zip(s0.peers, s1.peers, strict=True)}
    return out


def test_two_natted_peers_without_a_probe_between_them_are_assumed_relayed():
    pids = ids(4)
    views = {
        pids[0]: natted(pids[0]),
        pids[1]: natted(pids[1]),
        pids[2]: peer(pids[2]),
        pids[3]: peer(pids[3]),
    }
    state = SwarmState("s", 100.0, views)
    assert relayed_pairs(state, pids) == {(0, 1)}
    # A public and a NATed peer talk directly (the NATed one dials out): not relayed.
    assert relayed_pairs(state, [pids[0], pids[2]]) == set()


def test_a_probe_decides_over_the_assumption_either_way():
    pids = ids(3)
    views = {pids[0]: natted(pids[0]), pids[1]: natted(pids[1]), pids[2]: peer(pids[2])}
    # Every probe says "direct" (hole punching worked): nothing is relayed.
    direct = SwarmState("s", 100.0, views, uniform_links(pids))
    assert relayed_pairs(direct, pids) == set()
    # A probe between two public-looking peers saw a circuit: that pair is relayed.
    odd = uniform_links(pids, {frozenset((pids[1], pids[2]))})
    assert relayed_pairs(SwarmState("s", 100.0, views, odd), pids) == {(1, 2)}


def test_slow_pairs_slows_both_directions_and_nothing_else():
    model = from_matrices(np.full((3, 3), 5.0), np.full((3, 3), 1.0))
    slow = slow_pairs(model, [(0, 2)], 4.0)
    assert slow.bandwidth_gbps[0, 2] == slow.bandwidth_gbps[2, 0] == 0.25
    assert slow.bandwidth_gbps[0, 1] == slow.bandwidth_gbps[1, 2] == 1.0
    assert model.bandwidth_gbps[0, 2] == 1.0  # the input is left alone
    with pytest.raises(NetModelError):
        slow_pairs(model, [(0, 1)], 0.5)


def test_the_network_model_and_its_reason_carry_the_slowdown():
    pids = ids(4)
    views = {p: (natted(p) if i < 2 else peer(p)) for i, p in enumerate(pids)}
    state = SwarmState("s", 100.0, views, uniform_links(pids))
    model, note = network(state, pids)
    assert "relayed" not in note  # every pair was probed direct
    state = SwarmState("s", 100.0, views, uniform_links(pids, {frozenset(pids[:2])}))
    model, note = network(state, pids)
    assert "1 relayed pairs" in note
    assert model.bandwidth_gbps[0, 1] == pytest.approx(0.01 / RELAYED_SLOWDOWN)
    assert model.bandwidth_gbps[2, 3] == pytest.approx(0.01)


# One seed in the fast tier; each plan is a 2 s search, so the other two run with the slow tests.
@pytest.mark.parametrize(
    "seed", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)]
)
def test_a_plan_keeps_two_natted_peers_from_exchanging_bulk(seed):
    # 2 stages x 2 replicas of 4 equal peers: only the placement putting the two NATed peers on a
    # diagonal (neither replicas of a stage nor pipeline neighbours) keeps the relay idle. Their relayed
    # link measured twice as fast as the others (a well-placed relay), so without the slowdown a plan
    # would put bulk traffic on it.
    pids = ids(4)
    views = {p: (natted(p) if i < 2 else peer(p)) for i, p in enumerate(pids)}
    links = uniform_links(pids, {frozenset(pids[:2])}, relayed_gbps=0.02)
    state = SwarmState("s", 100.0, views, links)
    job = JOB.model_copy(update={"seed": seed})
    plan, _, reason = make_train_plan(state, job, 100.0, epoch=1, start_step=0)
    assert plan is not None, reason
    assert frozenset(pids[:2]) not in bulk_pairs(plan), (reason, plan.stages)
    # Every peer sends the leader its commit messages: a public one hears NATed peers directly.
    assert plan.leader not in pids[:2]


def test_confirmed_links_keep_a_relay_seen_by_either_end():
    a, b = ids(2)
    reports = {
        a: LinkReport(peer_id=a, issued_at=1.0, links=[LinkSample(dst=b, rtt_ms=30.0, bandwidth_gbps=0.01)]),
        b: LinkReport(
            peer_id=b,
            issued_at=1.0,
            links=[],
            inbound=[LinkSample(dst=a, rtt_ms=0.0, bandwidth_gbps=0.01, relayed=True)],
        ),
    }
    assert confirmed_links(reports)[a].links[0].relayed
    reports[b] = reports[b].model_copy(
        update={"inbound": [LinkSample(dst=a, rtt_ms=0.0, bandwidth_gbps=0.01)]}
    )
    assert not confirmed_links(reports)[a].links[0].relayed


def test_the_leader_is_a_public_peer_when_stage_0_has_one():
    from potluck.coordinator.job.plan import public_leader
    from potluck.coordinator.placement import PlacementPlan

    placement = PlacementPlan("step", (("n1", "p1", "n2"), ("a", "b", "c")), (), 1.0, 0.5, "x")
    moved = public_leader(placement, {"n1", "n2"})
    assert moved.stages == (("p1", "n1", "n2"), ("b", "a", "c"))  # pipelines move whole
    assert public_leader(moved, {"n1", "n2"}) is moved
    all_natted = public_leader(placement, {"n1", "p1", "n2"})
    assert all_natted is placement
