"""Notebook 01 (FP8 KV vs auto: serving) end to end on the test profile (cpu-ci, cpu-tiny with fewer repetitions), asserting on its summary."""

from __future__ import annotations

import math

import pytest

from fp8lab.paths import NOTEBOOKS_DIR
from fp8lab.report import TEST_PROFILE, load_profile

pytestmark = [
    pytest.mark.slow,
    pytest.mark.native_fp8,
]  # FP8 engines: skipped without the kernel (test_degraded.py covers that)

NB = NOTEBOOKS_DIR / "01_kv_dtype_auto_vs_fp8.ipynb"


@pytest.fixture(scope="module")
def summary(run_nb, tiny_model):
    assert "01_kv_dtype_auto_vs_fp8" in (load_profile(TEST_PROFILE).get("notebooks") or {}), (
        "fp8lab/profiles.yaml: cpu-tiny needs its notebooks.01_kv_dtype_auto_vs_fp8 entry (the small settings)"
    )
    return run_nb(NB, {"MODEL": tiny_model})[1]


def test_all_engines_ran(summary):
    assert summary["engines_ok"] == summary["engines"] == 2 * summary["trials"]  # one record per dtype and trial
    assert summary["trials"] >= 3 and summary["kv_dtypes"] == ["auto", "fp8"]
    assert summary["design"].startswith("paired")


def test_closed_loop_phases_are_sustained(summary):
    # every streamed closed-loop phase lasted at least PHASE_SECONDS and finished at least 4 x N requests
    assert summary["phase_seconds"] > 0
    assert summary["closed_phase_wall_s_min"] >= summary["phase_seconds"]
    assert summary["closed_phase_requests_min_ratio"] >= 4
    for c, n in summary["closed_loop_min_requests"].items():
        assert n >= 4 * int(c)


def test_fp8_doubles_capacity(summary):
    assert summary["capacity_ratio"] == pytest.approx(2.0, rel=0.02)
    for d in ("auto", "fp8"):
        assert summary[f"num_blocks_{d}"] == summary[f"predicted_blocks_{d}"]
        assert summary[f"mem_peak_gib_{d}"] > 0 and summary[f"mem_steady_gib_{d}"] > 0


def test_max_concurrency_without_preemption(summary):
    for d in ("auto", "fp8"):
        measured, formula = summary[f"max_concurrency_measured_{d}"], summary[f"max_concurrency_predicted_{d}"]
        assert measured is not None and not summary[f"max_concurrency_censored_{d}"]
        # the formula ignores vLLM's reserved null block: it may overshoot by one, never undershoot
        assert formula - 1 <= measured <= formula
        assert abs(measured - summary[f"max_concurrency_predicted_vllm_{d}"]) <= 1
    assert summary["max_concurrency_measured_fp8"] >= 2 * summary["max_concurrency_measured_auto"]


def test_deltas_are_paired_with_t_intervals_and_a_median_noise_floor(summary):
    deltas = summary["deltas"]
    for c in summary["concurrency"]:
        d = deltas[f"fp8: output tok/s @c={c}"]
        assert d["n"] == summary["trials"]  # one pair per trial
        assert d["lo_pct"] < d["delta_pct"] < d["hi_pct"]
        assert d["label"] in ("within noise", "better", "worse")
        assert (d["label"] == "within noise") == (d["lo_pct"] <= 0 <= d["hi_pct"])
        # n trials, 2 configs: 2 (n - 1) consecutive self-differences; the floor is their median, inside its IQR
        assert d["noise_pairs"] == 2 * (summary["trials"] - 1)
        assert d["noise_floor_q25_pct"] <= d["noise_floor_pct"] <= d["noise_floor_q75_pct"]
    for key, d in deltas.items():
        excludes_zero = d["lo_pct"] > 0 or d["hi_pct"] < 0
        assert d["beyond_noise_floor"] == (excludes_zero and abs(d["delta_pct"]) > d["noise_floor_pct"]), key
        assert d["detectable_pct"] == pytest.approx(max(d["noise_floor_pct"], (d["hi_pct"] - d["lo_pct"]) / 2)), key
    for m in ("TTFT P50", "TTFT P99", "TPOT P50", "TPOT P99", "ITL P50", "ITL P99"):
        for c in summary["concurrency"]:
            assert deltas[f"fp8: {m} @c={c}"]["n"] == summary["trials"]
    assert summary["throughput_delta_label"] in ("within noise", "better", "worse")
    assert summary["throughput_delta_n"] == summary["trials"] and summary["throughput_detectable_pct"] > 0
    assert summary["noise_floor_pct"] is not None and summary["noise_floor_pct"] >= 0
    lo, hi = summary["noise_floor_iqr_pct"]
    assert lo <= summary["noise_floor_pct"] <= hi


def test_auto_preempts_above_its_kv_limit(summary):
    # at c=16 the mix holds about 94 blocks in flight, more than auto's 64: auto preempts, at least as often as fp8
    assert summary["preemptions_auto"] > 0
    assert summary["preemptions_auto"] >= summary["preemptions_fp8"]


def test_latency_and_throughput_recorded(summary):
    for d in ("auto", "fp8"):
        assert summary[f"output_tok_s_{d}"] > 0 and summary[f"total_tok_s_{d}"] > summary[f"output_tok_s_{d}"]
        for m in ("ttft", "tpot", "itl"):
            p50, p99 = summary[f"{m}_p50_ms_{d}"], summary[f"{m}_p99_ms_{d}"]
            assert 0 < p50 <= p99


def test_open_loop_rate_achieved(summary):
    assert summary["open_loop"], "no open-loop phases recorded"
    for row in summary["open_loop"]:
        assert row["achieved_rate"] == pytest.approx(row["scheduled_rate"], rel=0.05), row
    assert summary["open_loop_send_lag_max_ms"] < 250


def test_roofline_bandwidth(summary):
    assert summary["bandwidth_gbs"] > 0 and not math.isnan(summary["bandwidth_gbs"])
    assert summary["bandwidth_source"] in ("measured", "parameter")


def test_both_methods_on_the_same_engines(summary):
    # the client that does not read the stream ran beside the streamed closed loop (claim 8 of the audit)
    assert summary["naive_concurrency"] and set(summary["naive_concurrency"]) <= set(summary["concurrency"])
    for c in summary["naive_concurrency"]:
        d = summary["deltas"][f"fp8: output tok/s (no stream) @c={c}"]
        assert d["lo_pct"] <= d["delta_pct"] <= d["hi_pct"]
        assert (d["label"] == "within noise") == (d["lo_pct"] <= 0 <= d["hi_pct"])
