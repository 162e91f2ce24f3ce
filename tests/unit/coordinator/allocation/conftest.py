"""Gavel's measured throughputs (../shared/data/gavel, or $POTLUCK_GAVEL_DATA); tests needing them skip
where the data is not checked out beside the repository."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from potluck.sim.cluster import GavelTable, load_gavel

DATA = Path(
    os.environ.get(
        "POTLUCK_GAVEL_DATA",
        Path(__file__).resolve().parents[5] / "shared" / "data" / "gavel" / "simulation_throughputs.json",
    )
)


@pytest.fixture(scope="session")
def gavel() -> GavelTable:
    if not DATA.is_file():
        pytest.skip(f"Gavel's throughputs not found at {DATA} (set POTLUCK_GAVEL_DATA)")
    return load_gavel(json.loads(DATA.read_text()))
