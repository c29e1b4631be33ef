"""Where the shipped assets live (the repository's ``data/`` folder) and where runs go."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "data"
MODELS_DIR = DATA_DIR / "models"
CONFIGS_DIR = DATA_DIR / "configs"
TEXT_DIR = DATA_DIR / "text"
PROMPTS_DIR = DATA_DIR / "prompts"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"

#: The shipped model: a small Qwen3 trained by ``scripts/train_tiny_model.py``.
TINY_MODEL_NAME = "fp8lab-tiny-qwen3"
TINY_MODEL_DIR = MODELS_DIR / TINY_MODEL_NAME


def runs_dir() -> Path:
    """Root of the results store (``$FP8LAB_RUNS`` or ``<repo>/runs``)."""
    return Path(os.environ.get("FP8LAB_RUNS", REPO_ROOT / "runs"))


@contextlib.contextmanager
def in_store(store: Path | str | None) -> Iterator[None]:
    """``$FP8LAB_RUNS`` set to ``store`` for the duration (every engine run, capture and exported scale set a study
    makes is kept under :func:`runs_dir`), restored after; None leaves it alone. A study's ``run(spec, store)``."""
    if store is None:
        yield
        return
    saved = os.environ.get("FP8LAB_RUNS")
    os.environ["FP8LAB_RUNS"] = str(store)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("FP8LAB_RUNS", None)
        else:
            os.environ["FP8LAB_RUNS"] = saved


#: When set (to anything), :func:`fp8lab.engine.results.run_cached` loads stored runs only and answers a missing one with
#: an ``error`` result instead of starting an engine (re-rendering reports from committed stores on another
#: machine); :func:`fp8lab.engine.capability.kv_support` then answers for the store, not for this device.
STORE_ONLY_ENV = "FP8LAB_STORE_ONLY"


def store_only() -> bool:
    """True while re-rendering reports from committed stores (``$FP8LAB_STORE_ONLY``): nothing may start an engine."""
    return bool(os.environ.get(STORE_ONLY_ENV))


#: Set on a GPU host to reuse a committed run measured by the same vLLM under older fp8lab engine code
#: (:func:`fp8lab.engine.results.reusable`): a study whose one part is re-measured keeps its other parts' runs.
REUSE_STORED_ENV = "FP8LAB_REUSE_STORED"


def reuse_stored() -> bool:
    """True where ``$FP8LAB_REUSE_STORED`` is set: a run of the same spec, phases and model stored under other
    engine code, by the vLLM installed here, is loaded instead of measured again."""
    return bool(os.environ.get(REUSE_STORED_ENV))
