"""`potluck testbed`: the errors a user without root or TUN sees (no network built)."""

from typer.testing import CliRunner

from potluck.cli import app
from potluck.testbed.wan import lab as wanlab

runner = CliRunner()


def test_testbed_is_listed_with_its_subcommands():
    result = runner.invoke(app, ["testbed", "--help"])
    assert result.exit_code == 0
    assert "check" in result.output and "clean" in result.output


def test_check_without_root_is_one_clear_line(monkeypatch):
    monkeypatch.setattr(wanlab.os, "geteuid", lambda: 1000)
    result = runner.invoke(app, ["testbed", "check", "--scenario", "home-5", "--json"])
    assert result.exit_code == 2
    assert "needs root" in result.output
    assert "Traceback" not in result.output


def test_check_of_a_missing_scenario_names_the_bundled_ones():
    result = runner.invoke(app, ["testbed", "check", "--scenario", "nope.json"])
    assert result.exit_code == 2
    assert "home-5" in result.output
