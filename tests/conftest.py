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


@pytest.fixture(scope="session")
def model_overrides(tiny_model) -> dict:
    """Notebook parameters that point a study at the test model (``FP8LAB_TEST_TOKENIZER`` adds TOKENIZER,
    for a model folder without one)."""
    out = {"MODEL": tiny_model}
    if os.environ.get("FP8LAB_TEST_TOKENIZER"):
        out["TOKENIZER"] = os.environ["FP8LAB_TEST_TOKENIZER"]
    return out
