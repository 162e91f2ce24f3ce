"""Per-link activation codecs end to end (issue 22): a 2x2 swarm on loopback whose signed plan codes
each pipeline link and direction with its own chain trains, and each peer's measured ratio (fp32 bytes
per wire byte of what it sent) is the one of the chain its plan gave its link."""

import asyncio
import math

import pytest

from potluck.protocol.training import LinkCodecs
from potluck.testbed.harness.training import tiny_job, train_swarm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_each_link_trains_with_its_own_chain(tmp_path):
    job = tiny_job(steps=3)  # the job's own chain is "none"
    # chains: 0 "none", 1 "int8", 2 "bf16"; replica 0 codes its link int8 forward and bf16 back
    links = LinkCodecs(chains=["none", "int8", "bf16"], forward=[[1, 0]], backward=[[2, 0]])
    reports, trainers = asyncio.run(train_swarm(job, 2, 2, [(0, 2), (2, 4)], tmp_path, link_codecs=links))
    losses = [r.loss for r in reports[(1, 0)]]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    ratio = {key: rep[-1].activation_ratio for key, rep in reports.items()}
    assert 3.5 < ratio[(0, 0)] < 4.0  # int8: one byte per value plus block scales
    assert 1.9 < ratio[(1, 0)] < 2.0  # bf16 gradients back
    assert 0.9 < ratio[(0, 1)] <= 1.0 and 0.9 < ratio[(1, 1)] <= 1.0  # the job's "none"
    assert trainers[(0, 0)].pipe_codecs.acts_out.spec == "int8"


def test_spot_checks_open_each_link_with_the_chain_it_carries(tmp_path):
    """Checkers decode a suspect's sealed sends with the chain of the link they crossed: with int8 one
    way and bf16 the other on replica 0's link, every check is conclusive and every peer is honest."""
    job = tiny_job(steps=4, trust={"spot_checks": 1.0})  # every micro-batch is checked
    links = LinkCodecs(chains=["none", "int8", "bf16"], forward=[[1, 0]], backward=[[2, 0]])
    _, trainers = asyncio.run(train_swarm(job, 2, 2, [(0, 2), (2, 4)], tmp_path, link_codecs=links))
    checked = {p: n for tr in trainers.values() for p, n in tr.audit.checked.items()}
    failed = {p: n for tr in trainers.values() for p, n in tr.audit.failed.items() if n}
    replica0 = {trainers[(0, 0)].box.peer_id, trainers[(1, 0)].box.peer_id}
    assert replica0 <= {p for p, n in checked.items() if n > 0}, checked  # its int8/bf16 link was opened
    assert not failed
