"""The simulator's outputs a user reads: PNG plots, the CSV time series, and `potluck sim` itself."""

from __future__ import annotations

import csv
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from potluck.cli import app
from potluck.sim.errors import SimError
from potluck.sim.plot import DPI, dht_png, kept_over_time, throughput_png
from potluck.sim.report import write_csv
from potluck.sim.runconfig import RunResult
from tests.unit.sim.test_run import STORMY, _run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG's IHDR chunk, after checking the signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def _result(rates: list[float], optimum: float) -> RunResult:
    """A run sampled every 0.1 h at ``rates`` (tokens/s) against a constant ``optimum``."""
    res = RunResult("repair", False, 0.1 * len(rates))
    for i, rate in enumerate(rates, start=1):
        res.tokens += rate * 360.0
        res.optimum_tokens += optimum * 360.0
        res.samples.append((0.1 * i, rate, optimum))
        res.totals.append((0.1 * i, res.tokens, res.optimum_tokens))
    return res


def test_kept_over_time_comes_from_the_totals_and_ends_at_the_runs_fraction() -> None:
    res = _result([100.0, 0.0, 50.0, 100.0], optimum=100.0)
    hours, kept = kept_over_time(res)
    np.testing.assert_allclose(hours, [0.1, 0.2, 0.3, 0.4])
    np.testing.assert_allclose(kept, [1.0, 0.5, 0.5, 0.625])
    assert kept[-1] == pytest.approx(res.fraction)


def test_throughput_png_is_a_png_of_the_promised_size(tmp_path: Path) -> None:
    runs = {"repair": _result([100.0, 80.0, 90.0], 100.0), "naive": _result([100.0, 40.0, 20.0], 100.0)}
    path = throughput_png(runs, tmp_path / "deep" / "day.png", "two runs")
    assert _png_size(path) == (9 * DPI, 6 * DPI)
    assert path.stat().st_size > 10_000  # axes, two runs, a legend: not an empty canvas


def test_dht_png_and_refusals(tmp_path: Path) -> None:
    rows = [
        {"peers": float(n), "requests_per_lookup": r, "messages_per_peer_per_min": 50.0 * r}
        for n, r in ((100, 21.0), (1000, 22.5))
    ]
    assert _png_size(dht_png(rows, tmp_path / "dht.png")) == (7 * DPI, 4 * DPI)
    with pytest.raises(SimError, match="no runs"):
        throughput_png({}, tmp_path / "x.png")
    with pytest.raises(SimError, match="no DHT"):
        dht_png([], tmp_path / "y.png")


def test_csv_rows_are_the_samples_with_running_totals(tmp_path: Path) -> None:
    _, res = _run(STORMY, policy="repair")
    with write_csv(res, tmp_path / "run.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(res.samples) > 10
    tokens = [float(r["tokens"]) for r in rows]
    assert tokens == sorted(tokens) and tokens[-1] <= res.tokens + 1.0  # totals only grow
    assert all(float(r["optimum_tokens"]) >= 0.0 for r in rows)


@pytest.mark.slow  # 400 simulated DHT lookups through the CLI, then a plot
def test_potluck_sim_runs_the_simulator_and_writes_its_files(tmp_path: Path) -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["sim", "run", "--help"])
    assert shown.exit_code == 0 and "--plot" in shown.output and "--churn-aware" in shown.output
    args = ["sim", "dht", "--peers", "64", "128", "--plot", str(tmp_path / "dht.png")]
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    rows = json.loads(done.output.strip().splitlines()[-1])
    assert [r["peers"] for r in rows] == [64.0, 128.0]
    assert _png_size(tmp_path / "dht.png")[0] > 0
    bad = runner.invoke(app, ["sim", "run", "--policy", "magic"])
    assert bad.exit_code == 2 and "invalid choice" in bad.output
