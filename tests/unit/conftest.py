"""Fixtures shared by the unit tests: the committed H200 stores of Studies 04, 06 and 07, unpacked once per session,
and each study loaded from them once, and Study 00 re-rendered on the H200 profile once (several test files check
their rows, summary and index numbers)."""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from typing import Any

import pytest

from fp8lab import studies
from fp8lab.engine import results
from fp8lab.paths import NOTEBOOKS_DIR, REPO_ROOT
from fp8lab.profiles import load_profile, resolved_parameters

H200 = REPO_ROOT / "reports" / "h200"


def _h200_params(name: str, extra: dict[str, Any], profile: str = "h200") -> dict[str, Any]:
    """The parameters notebook ``name`` runs with on an H200 profile (``h200``, or e.g. ``h200-decode-2026-11``, the
    Study 06 run before issue 35), ``extra`` on top."""
    return resolved_parameters(NOTEBOOKS_DIR / f"{name}.ipynb", load_profile(profile), extra)


@pytest.fixture(scope="session")
def h200_store(tmp_path_factory):
    """The committed H200 stores of Studies 04, 06 and 07, unpacked as they are: their runs are keyed by the model as
    given, not by the H200 host's checkout path (``scripts/rekey_stores.py``), so ``FP8LAB_STORE_ONLY`` finds them
    from any checkout."""
    root = tmp_path_factory.mktemp("h200-store")
    for name in ("04_long_context", "06_decode", "07_prefix_cache"):
        with tarfile.open(H200 / "records" / f"{name}.tar.gz") as tf:
            tf.extractall(root, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return root


@pytest.fixture(scope="session")
def h200_study(h200_store) -> Callable[..., tuple[Any, dict, list]]:
    """``load(notebook_stem, profile="h200", **parameter_overrides) -> (results, summary, rows)``: the study on an H200
    profile's parameters, run on the committed store under ``FP8LAB_STORE_ONLY`` (never an engine: what the store lacks is an
    error), once per session and arguments."""
    cache: dict[tuple, tuple[Any, dict, list]] = {}

    def load(name: str, profile: str = "h200", **extra: Any) -> tuple[Any, dict, list]:
        key = (name, profile, tuple(sorted(extra.items())))
        if key not in cache:
            mp = pytest.MonkeyPatch()
            mp.setenv(results.STORE_ONLY_ENV, "1")
            mp.setenv("FP8LAB_RUNS", str(h200_store))
            try:
                mod = studies.load(name)
                spec = mod.Spec.from_params(_h200_params(name, extra, profile))
                res = mod.run(spec, progress=False) if name.startswith("04") else mod.run(spec, store=h200_store)
                cache[key] = (res, res.summary(), res.rows())
            finally:
                mp.undo()
        return cache[key]

    return load


@pytest.fixture(scope="session")
def h200_00():
    """The H200 report's Study 00 as it re-renders: no engine (MEASURE False), every H200 engine on record."""
    from fp8lab.capacity import study as s00

    return s00.run(s00.Spec.from_params(_h200_params(s00.NAME, {"MEASURE": False})))
