"""Shared fixtures. Tiers: tests/unit (seconds, no vLLM), tests/integration (real CPU vLLM engines,
marked slow), tests/notebooks (papermill, marked slow). GPU-only tests are marked gpu. Tests that need the
native FP8 KV kernel are marked native_fp8 and skipped, with the reason, where fp8lab.engine.capability finds it
absent (an AVX2-only CPU, or FP8LAB_NATIVE_FP8=0); the header says which tier ran."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fp8lab.engine.capability import kv_support
from fp8lab.paths import REPO_ROOT, TINY_MODEL_DIR

# fp8lab's emulated-FP8 plugin is an entry point of the installed fp8lab (pyproject.toml). An environment
# installed before it existed lacks it: then a test-only registration (tests/plugin_dev) goes on the path
# of every process the tests start (engine workers, notebook kernels).
_PLUGIN_DEV = REPO_ROOT / "tests" / "plugin_dev"


def _plugin_registered() -> bool:
    from importlib.metadata import entry_points

    names = ("fp8lab.engine.fp8emu:register", "fp8lab.fp8emu:register")  # the second: an install made before the move
    return any(e.value in names for e in entry_points(group="vllm.general_plugins"))


if not _plugin_registered():  # spawned children take sys.path from their parent, other children PYTHONPATH
    sys.path.append(str(_PLUGIN_DEV))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(_PLUGIN_DEV)) if p)


def pytest_report_header(config) -> str:
    s = kv_support("fp8")
    if s.native:
        return f"fp8lab tier: native FP8 KV kernel present ({s.backend}): native_fp8 tests run; emulated FP8 tests run"
    return f"fp8lab tier: no native FP8 KV kernel ({s.reason}): native_fp8 tests skipped; emulated FP8 tests run"


def pytest_collection_modifyitems(config, items) -> None:
    s = kv_support("fp8")
    if s.native:
        return
    skip = pytest.mark.skip(reason=f"needs the native FP8 KV kernel: {s.reason}")
    for item in items:
        if "native_fp8" in item.keywords:
            item.add_marker(skip)


_SHARED = False


def pytest_runtest_setup(item) -> None:
    """Before the first test that may start engines (any tier but tests/unit): this session's engine forkserver,
    shared with every process the tests start (notebook kernels, ``fp8lab run``, study scripts), so vLLM is
    imported once per session, not once per process (:func:`fp8lab.engine.procs.share_forkserver`; a CPU only)."""
    global _SHARED
    if not _SHARED and "unit" not in item.path.parts:
        from fp8lab.engine.procs import share_forkserver

        share_forkserver()
        _SHARED = True


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """The shipped model folder (``FP8LAB_TEST_MODEL`` may point elsewhere while developing)."""
    path = Path(os.environ.get("FP8LAB_TEST_MODEL", TINY_MODEL_DIR))
    assert (path / "config.json").is_file(), f"shipped model missing at {path}"
    return str(path)


@pytest.fixture(scope="session")
def real_model() -> str:
    """The real model's checked folder (SmolLM2-135M-Instruct, :mod:`fp8lab.realmodel`): made by
    ``scripts/setup_cpu.sh``, made here if missing (about 15 s) or failing its manifest check."""
    from fp8lab import realmodel

    return str(realmodel.ensure())


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


def _engine_processes() -> list:
    from multiprocessing import forkserver

    import psutil

    server = getattr(forkserver._forkserver, "_forkserver_pid", None)  # its forked workers share its command line
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if (
                p.pid != server
                and p.status() != psutil.STATUS_ZOMBIE
                and "resource_tracker" not in " ".join(p.cmdline())
            ):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture
def engine_processes():
    """``() -> [psutil.Process]``: live descendants of the test process other than multiprocessing's resource
    tracker and the forkserver that CPU engine workers fork from (``fp8lab.engine.procs.worker_context``): what a
    finished or killed run must not leave behind. A worker forked by the forkserver is its child, not the test's,
    so it is found here too."""
    return _engine_processes
