"""The budget hook of tests/conftest.py: an unmarked test over the limit fails and names the marker to
add; a test with a tier marker, a fast one, or one that failed already is left as it is."""

from __future__ import annotations

import pytest

from tests import conftest


def report(duration: float, outcome: str = "passed", when: str = "call") -> pytest.TestReport:
    return pytest.TestReport(
        "tests/unit/x.py::test_x", ("x.py", 1, "test_x"), {}, outcome, None, when, [], duration
    )


def test_a_slow_unmarked_test_fails_and_a_marked_one_passes() -> None:
    why = conftest.over_budget(report(12.5), {"parametrize"}, 10.0)
    assert why is not None and "12.5 s" in why and "10 s" in why and "@pytest.mark.slow" in why
    for marker in ("slow", "integration", "extended", "docker"):
        assert conftest.over_budget(report(600.0), {marker}, 10.0) is None, marker
    assert conftest.over_budget(report(9.9), set(), 10.0) is None
    assert conftest.over_budget(report(12.5, outcome="failed"), set(), 10.0) is None  # its own failure
    assert conftest.over_budget(report(12.5, when="setup"), set(), 10.0) is None  # shared fixtures


def test_the_hook_fails_the_unmarked_test_in_a_real_session(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POTLUCK_UNMARKED_LIMIT_S", raising=False)  # the inner ini file's limit counts
    pytester.makeconftest("from tests.conftest import pytest_addoption, pytest_runtest_makereport  # noqa\n")
    pytester.makeini("[pytest]\nunmarked_limit_s = 0.2\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(
        """
        import time
        import pytest

        def test_unmarked():
            time.sleep(0.3)

        @pytest.mark.slow
        def test_marked():
            time.sleep(0.3)

        def test_quick():
            pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_unmarked took 0.* s, over the 0.2 s*@pytest.mark.slow*"])
    assert "test_marked" not in "\n".join(line for line in result.outlines if "FAILED" in line)


def test_the_environment_overrides_the_ini_files_limit(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POTLUCK_UNMARKED_LIMIT_S", raising=False)
    assert conftest.limit_s(request.config) == 10.0  # pyproject.toml
    monkeypatch.setenv("POTLUCK_UNMARKED_LIMIT_S", "30")
    assert conftest.limit_s(request.config) == 30.0


def test_every_test_under_tests_integration_is_marked_integration(request: pytest.FixtureRequest) -> None:
    items = [pytest.Function.from_parent(request.node.parent, name=request.node.name) for _ in range(2)]
    items[0].path = conftest.INTEGRATION / "training" / "test_x.py"
    conftest.pytest_collection_modifyitems(items)
    assert items[0].get_closest_marker("integration") is not None
    assert items[1].get_closest_marker("integration") is None  # this file is a unit test


def test_under_xdist_every_swarm_is_one_work_unit_and_each_unit_file_another() -> None:
    scopes = [
        conftest.worker_scope(n)
        for n in (
            "tests/integration/churn/test_churn.py::test_a[sigkill]",
            "tests/integration/wan/test_wan_nat.py::test_b",
            "tests/unit/sim/test_run.py::test_c[1]",
            "tests/unit/sim/test_run.py::test_d",
            "tests/unit/test_layers.py::test_e",
        )
    ]
    assert scopes == [
        "tests/integration",
        "tests/integration",
        "tests/unit/sim/test_run.py",
        "tests/unit/sim/test_run.py",
        "tests/unit/test_layers.py",
    ]
