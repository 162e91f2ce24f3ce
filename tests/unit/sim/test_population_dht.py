"""Home links per peer, planning states of subsets, and Kademlia traffic."""

from __future__ import annotations

import numpy as np
import pytest

from potluck.sim.dht import DhtConfig, Kademlia, measure
from potluck.sim.errors import SimError
from potluck.sim.population import link_matrices, make_population, planning_state


def test_a_pair_looks_the_same_in_every_subset() -> None:
    pop = make_population(500, np.random.default_rng(0))
    lat1, bw1 = link_matrices(pop, np.array([3, 17, 250]))
    lat2, bw2 = link_matrices(pop, np.array([250, 9, 3]))
    assert lat1[0, 2] == pytest.approx(lat2[2, 0])
    assert bw1[2, 0] == pytest.approx(bw2[0, 2])
    assert lat1[0, 2] != lat1[2, 0]  # directions differ by up to 5%


def test_rates_are_capped_by_the_sender_uplink_and_the_receiver_downlink() -> None:
    pop = make_population(300, np.random.default_rng(1))
    ids = np.arange(0, 300, 7)
    _, bw = link_matrices(pop, ids)
    off = ~np.eye(len(ids), dtype=bool)
    cap = np.minimum(pop.up_gbps[ids][:, None], pop.down_gbps[ids][None, :])
    assert (bw[off] <= cap[off] + 1e-12).all()
    assert (bw[off] >= 0.6 * cap[off] - 1e-12).all()
    assert float(np.median(pop.down_gbps / pop.up_gbps)) > 4.0  # home links: upload far below download


def test_planning_state_names_identities() -> None:
    pop = make_population(100, np.random.default_rng(2))
    st = planning_state(pop, np.array([5, 6, 40]))
    assert st.peers == (5, 6, 40)
    assert st.devices[2].tflops == pytest.approx(float(pop.tflops[40]))
    with pytest.raises(SimError):
        make_population(1, np.random.default_rng(0))


@pytest.mark.slow  # 300 lookups in DHTs of 250 and 8,000 simulated peers
def test_lookups_grow_with_log_n_not_n() -> None:
    small = measure(250, np.random.default_rng(0), lookups=150)
    large = measure(8000, np.random.default_rng(0), lookups=150)
    assert small["rounds_per_lookup"] < large["rounds_per_lookup"]
    # 32x the peers (5 doublings) adds a few requests per lookup, nowhere near 32x.
    assert large["requests_per_lookup"] < small["requests_per_lookup"] + 2.5 * 5
    assert large["messages_per_peer_per_min"] < 1.5 * small["messages_per_peer_per_min"]


def test_message_count_follows_the_refresh_rates() -> None:
    cfg = DhtConfig(k=20, refresh_s=10.0, link_report_s=60.0, bucket_refresh_s=600.0)
    m = measure(500, np.random.default_rng(1), cfg, lookups=50)
    issued = 7.0 * (m["requests_per_lookup"] + 20) + 0.1 * m["requests_per_lookup"]
    assert m["messages_per_peer_per_min"] == pytest.approx(4.0 * issued)


def test_a_lookup_queries_someone() -> None:
    dht = Kademlia(1000, np.random.default_rng(3))
    requests, rounds = dht.lookup(0, 12345, alpha=3)
    assert requests >= 3 and rounds >= 1
