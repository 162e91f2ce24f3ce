"""Starting the tiny job when every peer announces a dead address before its real one: the follower
dials the leader over all announced addresses with backoff, and no start dies before its first step.
(The issue's 20 starts in a row: ``scripts/bench_starts.py``; the suite runs a few.)"""

import pytest

from potluck.testbed.harness.starts import start_tiny_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

STARTS = 2  # about 25 s each on 2 cores


def test_starts_with_undialable_announced_addresses_never_fail(tmp_path):
    for i in range(STARTS):
        result = start_tiny_job(tmp_path / f"start-{i}", f"dial-{i}")
        assert result.ok, f"start {i} failed after {result.seconds:.0f} s:\n{result.tail}"
        assert result.plans == 1, f"start {i} needed {result.plans} plans:\n{result.tail}"
