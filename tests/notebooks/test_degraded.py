"""Notebooks on a device without the native FP8 KV kernel, forced here with ``FP8LAB_NATIVE_FP8=0`` (read by
fp8lab.engine.capability only): Study 01 (a speed study) runs reduced and says what was not measured and why, with
the formula's predicted capacities; Study 03 (a numerical study) runs its fp8 configuration emulated,
labelled ``fp8 (emulated)``, never mixed with native results. These run on every machine."""

from __future__ import annotations

import os

import pytest

from fp8lab.engine.capability import NATIVE_FP8_ENV, kv_support
from fp8lab.paths import NOTEBOOKS_DIR

pytestmark = pytest.mark.slow

# Whether this device has the kernel (read before the tests switch it off): where it does, the native tests ran
# notebook 03's auto engines on the test profile and this module's Study 03 loads them from the session's store.
NATIVE = kv_support("fp8").native


@pytest.fixture(scope="module")
def no_native_fp8():
    old = os.environ.get(NATIVE_FP8_ENV)
    os.environ[NATIVE_FP8_ENV] = "0"  # the notebook kernels and their engine workers inherit it
    yield
    if old is None:
        os.environ.pop(NATIVE_FP8_ENV, None)
    else:
        os.environ[NATIVE_FP8_ENV] = old


def test_nb01_says_what_was_not_measured(no_native_fp8, run_nb, model_overrides):
    params, s = run_nb(NOTEBOOKS_DIR / "01_kv_dtype_auto_vs_fp8.ipynb", model_overrides)
    assert s["degraded"] is True
    assert (
        s["not_measured"].startswith("Not measured: the serving throughput")
        and "FP8LAB_NATIVE_FP8=0" in s["not_measured"]
    )
    assert s["fp8.status"] == "unsupported" and "switched off" in s["fp8.unsupported_reason"]
    assert s["auto.status"] == "not run"
    # the formula, marked predicted: 128-token blocks of 6 layers x 2 KV heads x 64 x 2 (K, V) x 2 bytes (auto), 1 (fp8)
    budget = int(params["KV_CACHE_GIB"] * 2**30)
    assert s["auto.predicted_num_blocks"] == budget // (128 * 3072) > 0
    assert s["fp8.predicted_num_blocks"] == budget // (128 * 1536)
    assert not any(k.startswith("fp8.") and k.endswith(("tok_s", "ttft_ms")) for k in s)  # nothing measured


def test_nb03_runs_fp8_emulated(no_native_fp8, run_nb, model_overrides):
    # What is tested here is the label, the emulation and the refusal to mix, not the quality figures. Where the
    # native tests ran (NATIVE), notebook 03's auto engines are in the store: the profile's settings start only the
    # emulated engine. Without the kernel the tier's profile (cpu-ci-emulated) is small, and test_nb03.py then loads
    # both engines started here.
    _, s = run_nb(NOTEBOOKS_DIR / "03_quality_token_match.ipynb", {**model_overrides, "KV_DTYPES": ["auto", "fp8"]})
    emu = "fp8 (emulated)"
    assert s["labels"] == ["auto", emu]
    assert s[f"{emu}.status"] == "ok" and not any(k.startswith("fp8.") for k in s)  # never mixed with native
    assert s[f"{emu}.kv_roundtrip.K.rel_err"] > 0  # the round trip this engine applies, under the label it ran as
    assert "ran emulated" in s["not_measured"] and "FP8LAB_NATIVE_FP8=0" in s["not_measured"]
    # an FP8-sized perturbation: some logprob moved, top-1 agreement still high
    assert s[f"{emu}.tf_abs_dlogprob"] > 0 and 0.9 <= s[f"{emu}.tf_top1"] <= 1.0
    assert s["auto.rerun_max_abs_dlogprob"] == 0.0
    assert s["emulation_vs_native"].startswith("Emulated vs native FP8: not compared here")


def test_nb07_measures_auto_and_says_fp8_was_not_measured(
    no_native_fp8, run_nb, model_overrides, tmp_path, monkeypatch
):
    """Study 07 (prefix cache): an emulated FP8 cache keeps auto's block count, so it cannot stand in for the study's
    effect (twice the blocks); fp8 is refused before any engine starts, auto is measured, and the run stays
    incomplete so that a device with the kernel fills fp8 in."""
    monkeypatch.setenv("FP8LAB_RUNS", str(tmp_path / "runs"))  # its own store: the native test must not load it
    # what is tested here is the refusal and the incomplete run, not the sweep: one workload (the profile's JSON
    # template, a shared prefix), two load levels, two trials
    small = {"ACTIVE": [2, 4], "TRIALS": 2, "WORKLOADS": [["json", 192, 96, 32, 16, 3]]}
    _, s = run_nb(NOTEBOOKS_DIR / "07_prefix_cache.ipynb", {**model_overrides, **small})
    assert s["engines_status"] == {"auto": "ok", "fp8": "unsupported"}
    assert "FP8LAB_NATIVE_FP8=0" in s["engine_errors"]["fp8"]
    assert s["claim_verdict"] == "not measured" and s["complete"] is False
    assert s["num_blocks"] == {"auto": s["num_blocks_formula"]["auto"]}  # only auto started, as the formula says
    held = {(k["workload"], k["kv_dtype"]): k["measured_last_held"] for k in s["knees"]}
    assert all(v is not None for (w, d), v in held.items() if d == "auto") and set(held) == {
        ("json", "auto"),
        ("json", "fp8"),
    }
    assert all(v is None for (w, d), v in held.items() if d == "fp8")
