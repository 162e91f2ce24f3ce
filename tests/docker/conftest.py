import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Registered here so tests/docker needs nothing in pyproject.toml; harmless if pyproject has it too.
    config.addinivalue_line(
        "markers", "docker: builds images and runs a compose swarm (POTLUCK_DOCKER_TESTS=1)"
    )
