"""The notebook tier's runner: a notebook executed top to bottom by papermill on the test profile (``cpu-ci``, cpu-tiny
with fewer repetitions; ``cpu-ci-emulated``, smaller quality sets, where FP8 runs emulated), on every CPU. Where the native FP8 KV kernel is missing (an AVX2-only CPU) the notebooks take
the path the main job takes there (:mod:`fp8lab.report.degrade`, :mod:`fp8lab.engine.fp8emu`) and the tests assert what that path
must show; ``native_fp8`` and ``kv_label`` say which path ran and what a dtype is called on it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fp8lab.engine.capability import kv_support
from fp8lab.engine.fp8emu import emulated_label
from fp8lab.profiles import load_profile, resolved_parameters, tier_profile
from fp8lab.report import pagecheck

#: Whether this device has the native FP8 KV kernel, read once at collection (before test_degraded.py switches it
from fp8lab.report.run import run_notebook
from fp8lab.studies import all_studies

#: off for its own tests): as the root conftest decides which ``native_fp8`` tests run.
NATIVE_FP8 = kv_support("fp8").native
#: Why fp8 does not run natively here, as the pages must say it: this CPU's reason (an AVX2-only CPU: "... requires
#: x86 with AVX-512 or AMX ..."), or the switch's where ``FP8LAB_NATIVE_FP8=0`` is set for the whole session (the
#: AVX2 path checked on a CPU that has the kernel); ``None`` where it runs natively.
NO_KERNEL = kv_support("fp8").reason
#: The tier's profile: cpu-ci, or cpu-ci-emulated where FP8 runs emulated (fp8lab/profiles.yaml says why).
PROFILE = tier_profile(NATIVE_FP8)


@pytest.fixture(scope="session")
def profile() -> dict:
    """The tier's profile (:data:`PROFILE`), loaded."""
    return load_profile(PROFILE)


@pytest.fixture(scope="session")
def native_fp8() -> bool:
    """True where the FP8 engines ran natively; False where the notebooks took the emulated / reduced path."""
    return NATIVE_FP8


@pytest.fixture(scope="session")
def no_kernel() -> str | None:
    """:data:`NO_KERNEL`: the reason the pages give for fp8 not running natively here."""
    return NO_KERNEL


@pytest.fixture(scope="session")
def kv_label() -> Callable[[str], str]:
    """``label(kv_dtype)``: how a study names a kv dtype's configuration on this device: the dtype itself where it
    runs natively (and ``auto`` everywhere), ``<dtype> (emulated)`` for an FP8 dtype without the kernel."""
    return lambda d: d if NATIVE_FP8 or d == "auto" else emulated_label(d)


@pytest.fixture(scope="session")
def run_nb(tmp_path_factory, runs_root, profile) -> Callable[[Path, dict], tuple[dict, dict]]:
    """``run(notebook, overrides) -> (params, summary)``: the notebook's parameters on the tier's profile with
    ``overrides`` on top, executed into a fresh folder of the session's store; fails the test unless it ran and
    its fresh page passes the reader's text check (``fp8lab.report.pagecheck``)."""

    def run(notebook: Path, overrides: dict) -> tuple[dict, dict]:
        params = resolved_parameters(notebook, profile, overrides)
        out_dir = tmp_path_factory.mktemp(notebook.stem[:4])
        entry = run_notebook(notebook, out_dir, params, progress=False)
        assert entry["status"] == "ok", entry["error"]
        page = out_dir / f"{notebook.stem}.html"
        found = pagecheck.problems(page.read_text(encoding="utf-8"))
        assert not found, f"{page.name}: " + "; ".join(str(p) for p in found[:5])
        return params, entry["summary"]

    return run


#: Everything a reduced notebook records (fp8lab.report.degrade.summary) for the default dtypes: the sentence, the statuses,
#: the capability report and the formula's capacities; no measured figure.
REDUCED_KEYS = frozenset(
    {
        "not_measured",
        "degraded",
        "capability",
        "auto.status",
        "fp8.status",
        "fp8.unsupported_reason",
        *(f"{d}.predicted_{k}" for d in ("auto", "fp8") for k in ("num_blocks", "kv_capacity_tokens")),
    }
)


@pytest.fixture(scope="session")
def not_measured() -> Callable[..., None]:
    """``check(summary, number, *keys)``: the reduced page of study ``number`` (a speed study on a device without the
    kernel, the study's ``NATIVE_ONLY``, :func:`fp8lab.report.degrade.gate`) says that, and why, fp8's figures were not measured, records only
    :data:`REDUCED_KEYS` and so none of ``keys``."""

    def check(summary: dict, number: str, *keys: str) -> None:
        assert summary["degraded"] is True and set(summary) == REDUCED_KEYS, set(summary) ^ REDUCED_KEYS
        native_only = next(s.NATIVE_ONLY for s in all_studies().values() if s.NAME.startswith(f"{number}_"))
        assert summary["not_measured"].startswith(f"Not measured: the {native_only} of kv_cache_dtype fp8, ")
        assert summary["fp8.unsupported_reason"] in summary["not_measured"]
        assert summary["auto.status"] == "not run" and summary["fp8.status"] == "unsupported"
        assert not set(keys) & set(summary)

    return check
