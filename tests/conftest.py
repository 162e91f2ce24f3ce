"""The suite's tiers (docs/development.md, Tests) and the budget that keeps the fast one fast.

A test with none of the tier markers runs in every tier, `scripts/test.sh --fast` included, so its call
phase may take at most ``unmarked_limit_s`` (pyproject.toml: 10 s; the environment variable
``POTLUCK_UNMARKED_LIMIT_S`` overrides it on a loaded machine). Past that it fails, naming the marker to
add: the fast tier's 3-minute budget guards itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]  # tests/unit/test_tiers.py runs the budget hook in an inner session

# The peers a test starts begin at normal CPU priority (``potluck peer --start-nice``, default 10): the
# suite's other worker runs unit tests at normal priority, and a niced peer's start-up and heartbeats
# beside them only make its swarm slower and its waits flakier; nobody trains beside it to protect.
# Children inherit it; tests/unit/peer/test_priority.py tests the niced start-up itself.
os.environ.setdefault("POTLUCK_START_NICE", "0")

# A test carrying any of these runs outside the fast tier (pyproject.toml describes each).
TIER_MARKERS = frozenset({"slow", "integration", "extended", "docker"})
INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "unmarked_limit_s", "seconds the call phase of a test without a tier marker may take", "string", "10"
    )


def limit_s(config: pytest.Config) -> float:
    """Seconds an unmarked test's call phase may take: the environment's, else the ini file's."""
    return float(os.environ.get("POTLUCK_UNMARKED_LIMIT_S") or config.getini("unmarked_limit_s"))


def over_budget(report: pytest.TestReport, markers: set[str], limit: float) -> str | None:
    """Why a passed, unmarked test fails the budget (None when it does not): its call took > ``limit`` s."""
    if report.when != "call" or not report.passed or markers & TIER_MARKERS or report.duration <= limit:
        return None
    return (
        f"{report.nodeid} took {report.duration:.1f} s, over the {limit:g} s an unmarked test may take "
        "(the fast tier runs it). Make it cheaper, or mark it: @pytest.mark.slow for a unit test that "
        "compiles, spawns processes or searches for seconds; @pytest.mark.integration for a swarm "
        "(docs/development.md, Tests)."
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/integration is `integration`, whether or not its module says so
    (a ``pytestmark`` in a conftest.py marks nothing), before ``-m`` selects the tier."""
    for item in items:
        if INTEGRATION in item.path.parents and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)


def worker_scope(nodeid: str) -> str:
    """The unit of work one pytest-xdist worker takes whole (scripts/test.sh runs ``-n``): every process
    swarm (``tests/integration``) in one, so they run one after another while the other workers share
    the unit tests file by file (a module's fixtures start once). Swarm files side by side on 2 cores
    saved about a fifth of their time but missed deadlines (docs/benchmarks/suite.md)."""
    path = nodeid.split("::", 1)[0]
    return "tests/integration" if path.startswith("tests/integration/") else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's own ``--dist loadgroup`` marks do nothing under pytest 9 (it renames node ids, which
    pytest 9 no longer reads), so the suite brings its scheduler: xdist's per-scope one, scoped above."""
    from xdist.scheduler import LoadScopeScheduling

    class SwarmsOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_scope(nodeid)

    return SwarmsOnOneWorker(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    why = over_budget(report, {m.name for m in item.iter_markers()}, limit_s(item.config))
    if why is not None:
        report.outcome = "failed"
        report.longrepr = why
    return report
