"""Fixtures: the tiny Hugging Face models of ``tests/helpers/hfmodels.py``, saved under the test's tmp."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.hfmodels import make_model


@pytest.fixture
def llama(tmp_path: Path) -> tuple[Path, Any]:
    return tmp_path / "llama", make_model("llama", tmp_path / "llama")


@pytest.fixture
def qwen2(tmp_path: Path) -> tuple[Path, Any]:
    return tmp_path / "qwen2", make_model("qwen2", tmp_path / "qwen2")
