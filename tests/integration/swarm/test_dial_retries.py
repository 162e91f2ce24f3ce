"""Starting the tiny job when every peer announces a dead address before its real one: the follower
dials the leader over all announced addresses with backoff, and the start trains its first step under
its first plan. That no start fails is a rate: ``scripts/bench_starts.py`` runs the issue's 20 starts
in a row and fails unless every one reached its last step under its first plan."""

import pytest

from potluck.testbed.harness.starts import start_tiny_job

pytestmark = [pytest.mark.integration, pytest.mark.extended, pytest.mark.timeout(600)]


def test_a_start_with_undialable_announced_addresses_trains_under_its_first_plan(tmp_path):
    result = start_tiny_job(tmp_path / "start", "dial")  # about 25 s on 2 cores
    assert result.ok, f"the start failed after {result.seconds:.0f} s:\n{result.tail}"
    assert result.plans == 1, f"the start needed {result.plans} plans:\n{result.tail}"
