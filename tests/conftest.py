"""Shared fixtures. Tiers: tests/unit (seconds, no vLLM), tests/integration (real CPU vLLM engines,
marked slow), tests/notebooks (papermill, marked slow). GPU-only tests are marked gpu."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fp8lab.paths import TINY_MODEL_DIR


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """The shipped model folder (``FP8LAB_TEST_MODEL`` may point elsewhere while developing)."""
    path = Path(os.environ.get("FP8LAB_TEST_MODEL", TINY_MODEL_DIR))
    assert (path / "config.json").is_file(), f"shipped model missing at {path}"
    return str(path)


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory) -> Path:
    """A results store private to this test session."""
    root = tmp_path_factory.mktemp("runs")
    os.environ["FP8LAB_RUNS"] = str(root)
    return root
