"""The real thing: build the CPU images with podman and train the tiny job with the compose swarm.

Runs scripts/check_docker.sh (root, apt, the package index, about 10 minutes) only when
POTLUCK_DOCKER_TESTS=1; docs/docker.md says what it does and how long it took.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_docker.sh"
LIMIT_S = 3600

pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.timeout(LIMIT_S + 60),
    pytest.mark.skipif(
        os.environ.get("POTLUCK_DOCKER_TESTS") != "1",
        reason="builds images and runs a podman compose swarm; set POTLUCK_DOCKER_TESTS=1 (root, network)",
    ),
]


def test_compose_swarm_trains_the_tiny_job() -> None:
    proc = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=LIMIT_S,
    )
    sys.stdout.write(proc.stdout[-20000:])
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert "OK: the compose swarm trained tiny to its last step" in proc.stdout
