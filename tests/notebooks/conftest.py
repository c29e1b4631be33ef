"""The notebook tier's runner: a notebook executed top to bottom by papermill on the test profile (``cpu-ci``, cpu-tiny with fewer repetitions)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fp8lab.report import TEST_PROFILE, load_profile, resolved_parameters, run_notebook


@pytest.fixture(scope="session")
def run_nb(tmp_path_factory, runs_root) -> Callable[[Path, dict], tuple[dict, dict]]:
    """``run(notebook, overrides) -> (params, summary)``: the notebook's parameters on the test profile with
    ``overrides`` on top, executed into a fresh folder of the session's store; fails the test unless it ran."""

    def run(notebook: Path, overrides: dict) -> tuple[dict, dict]:
        params = resolved_parameters(notebook, load_profile(TEST_PROFILE), overrides)
        entry = run_notebook(notebook, tmp_path_factory.mktemp(notebook.stem[:4]), params, progress=False)
        assert entry["status"] == "ok", entry["error"]
        return params, entry["summary"]

    return run
