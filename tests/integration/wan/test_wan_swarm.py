"""A swarm in the WAN testbed: the coordinator and each peer in a namespace of their own, joined only by
the relay's emulated home links, train a job to its end (issue 15, items 3 and 5: peer1 is behind a symmetric NAT).

Runs ``scripts/bench_wan.py --only home`` on a 3-node asymmetric scenario (node 0 the coordinator, two
peers: 2 stages x 1 replica) for a few steps and checks what it reports: every step trained, the plan
made from measured links and declared access links, and every node's traffic on its own TUN device.
Needs root, /dev/net/tun and iproute2; skipped otherwise.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.wanlab import NEEDS_WAN_TESTBED


def lab_namespaces() -> set[str]:
    """Every WAN lab namespace now (``plw<pid>-<i>``), whoever made it."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("plw")}


ROOT = Path(__file__).resolve().parents[3]
SCENARIO = Path(__file__).parent / "data" / "wan-3-asym.json"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    *NEEDS_WAN_TESTBED,
]


def test_a_job_trains_to_its_end_over_emulated_home_links(tmp_path: Path) -> None:
    out = tmp_path / "wan.json"
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "bench_wan.py"),
        "--only",
        "home",
        "--scenario",
        str(SCENARIO),
        "--steps",
        "4",
        "--tokens-per-step",
        "1024",
        "--no-check",
        "--nat",
        "2:symmetric",  # peer1 behind a carrier-grade NAT: it must still train
        "--timeout",
        "200",
        "--out",
        str(out),
    ]
    before = lab_namespaces()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    home = json.loads(out.read_text())["home"]
    assert home["steps"] == 4
    assert (home["stages"], home["replicas"]) == (2, 1)
    assert "declared access links" in home["links"]  # peers said which way their line is slow
    # The NATed peer joined through the coordinator, was placed, and its pipeline neighbour reached it
    # over the connection it dialled out (no relay between them).
    assert home["nat"] == {"peer1": "symmetric"}
    assert sorted(home["placed"].values()) == [[0, 0], [1, 0]]
    assert home["relayed_links"] == [] and home["relayed_bulk_pairs"] == []
    # Each node's traffic left through its own emulated link; the peers carried the training.
    sent = home["wire_bytes_sent_per_node"]
    assert len(sent) == 3 and all(b > 0 for b in sent)
    assert min(sent[1:]) > 100_000
    assert lab_namespaces() <= before  # the lab is gone
