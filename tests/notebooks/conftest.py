"""The notebook tier's runner: a notebook executed top to bottom by papermill on the test profile (``cpu-ci``, cpu-tiny with fewer repetitions)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fp8lab import pagecheck
from fp8lab.report import TEST_PROFILE, load_profile, resolved_parameters, run_notebook


@pytest.fixture(scope="session")
def run_nb(tmp_path_factory, runs_root) -> Callable[[Path, dict], tuple[dict, dict]]:
    """``run(notebook, overrides) -> (params, summary)``: the notebook's parameters on the test profile with
    ``overrides`` on top, executed into a fresh folder of the session's store; fails the test unless it ran and
    its fresh page passes the reader's text check (``fp8lab.pagecheck``)."""

    def run(notebook: Path, overrides: dict) -> tuple[dict, dict]:
        params = resolved_parameters(notebook, load_profile(TEST_PROFILE), overrides)
        out_dir = tmp_path_factory.mktemp(notebook.stem[:4])
        entry = run_notebook(notebook, out_dir, params, progress=False)
        assert entry["status"] == "ok", entry["error"]
        page = out_dir / f"{notebook.stem}.html"
        found = pagecheck.problems(page.read_text(encoding="utf-8"))
        assert not found, f"{page.name}: " + "; ".join(str(p) for p in found[:5])
        return params, entry["summary"]

    return run
