"""Notebook 01 (FP8 KV vs auto: serving) end to end on the test profile (cpu-ci, cpu-tiny with fewer repetitions), asserting on its summary.

Without the native FP8 KV kernel (``native_fp8`` False) the runner executes the reduced notebook instead
(:mod:`fp8lab.report.degrade`: speed and measured capacity cannot be emulated): each test then asserts what that page says
about its part: not measured and why, the formula's capacities marked predicted, no figure the page did not measure,
and an audit that finds no serving evidence in it."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from scipy import stats as scipy_stats

from fp8lab import audit
from fp8lab import summary_table as st
from fp8lab.paths import NOTEBOOKS_DIR

pytestmark = pytest.mark.slow

NB = NOTEBOOKS_DIR / "01_kv_dtype_auto_vs_fp8.ipynb"


@pytest.fixture(scope="module")
def nb01(run_nb, tiny_model, profile):
    assert "01_kv_dtype_auto_vs_fp8" in (profile.get("notebooks") or {}), (
        "fp8lab/profiles.yaml: cpu-tiny needs its notebooks.01_kv_dtype_auto_vs_fp8 entry (the small settings)"
    )
    return run_nb(NB, {"MODEL": tiny_model})


@pytest.fixture(scope="module")
def summary(nb01):
    return nb01[1]


def test_all_engines_ran(summary, native_fp8, not_measured, no_kernel):
    if not native_fp8:  # no engine started: auto is not run, fp8 unsupported with the reason
        not_measured(summary, "01", "engines", "engines_ok", "trials")
        assert no_kernel in summary["fp8.unsupported_reason"]
        caps = {r["kv_cache_dtype"]: r for r in summary["capability"]["kv_dtypes"]}  # fp8lab doctor's table
        assert caps["fp8"]["native"] is False and caps["auto"]["native"] is True
        return
    assert summary["engines_ok"] == summary["engines"] == 2 * summary["trials"]  # one record per dtype and trial
    assert summary["trials"] >= 3 and summary["kv_dtypes"] == ["auto", "fp8"]
    assert summary["design"].startswith("paired")


def test_closed_loop_phases_are_sustained(summary, native_fp8, not_measured):
    if not native_fp8:
        return not_measured(summary, "01", "phase_seconds", "closed_phase_wall_s_min", "closed_loop_min_requests")
    # every streamed closed-loop phase lasted at least PHASE_SECONDS and finished at least 4 x N requests
    assert summary["phase_seconds"] > 0
    assert summary["closed_phase_wall_s_min"] >= summary["phase_seconds"]
    assert summary["closed_phase_requests_min_ratio"] >= 4
    for c, n in summary["closed_loop_min_requests"].items():
        assert n >= 4 * int(c)


def test_fp8_doubles_capacity(nb01, native_fp8, not_measured):
    params, summary = nb01
    if (
        not native_fp8
    ):  # the formula's capacities, marked predicted: 24 MiB in 128-token blocks of 3,072 / 1,536 B/token
        budget = int(params["KV_CACHE_GIB"] * 2**30)
        assert summary["auto.predicted_num_blocks"] == budget // (128 * 3072) == 64
        assert summary["fp8.predicted_num_blocks"] == 2 * summary["auto.predicted_num_blocks"]
        for d in ("auto", "fp8"):
            assert summary[f"{d}.predicted_kv_capacity_tokens"] == 128 * summary[f"{d}.predicted_num_blocks"]
        return not_measured(summary, "01", "capacity_ratio", "num_blocks_auto", "num_blocks_fp8")
    assert summary["capacity_ratio"] == pytest.approx(2.0, rel=0.02)
    for d in ("auto", "fp8"):
        assert summary[f"num_blocks_{d}"] == summary[f"predicted_blocks_{d}"]
        assert summary[f"mem_peak_gib_{d}"] > 0 and summary[f"mem_steady_gib_{d}"] > 0


def test_max_concurrency_without_preemption(summary, native_fp8, not_measured):
    if not native_fp8:
        return not_measured(summary, "01", *(f"max_concurrency_measured_{d}" for d in ("auto", "fp8")))
    for d in ("auto", "fp8"):
        measured, formula = summary[f"max_concurrency_measured_{d}"], summary[f"max_concurrency_predicted_{d}"]
        assert measured is not None and not summary[f"max_concurrency_censored_{d}"]
        # the formula ignores vLLM's reserved null block: it may overshoot by one, never undershoot
        assert formula - 1 <= measured <= formula
        assert abs(measured - summary[f"max_concurrency_predicted_vllm_{d}"]) <= 1
    assert summary["max_concurrency_measured_fp8"] >= 2 * summary["max_concurrency_measured_auto"]


def test_deltas_are_paired_with_t_intervals_and_a_median_noise_floor(summary, native_fp8, not_measured):
    if not native_fp8:
        return not_measured(summary, "01", "deltas", "throughput_delta_label", "noise_floor_pct")
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
        # the smallest effect the n paired trials detect with 80% power (two-sided 5%, t on n - 1 df), or the floor
        t975, t80 = (scipy_stats.t.ppf(q, d["n"] - 1) for q in (0.975, 0.8))
        half_log = (math.log(1 + d["hi_pct"] / 100) - math.log(1 + d["lo_pct"] / 100)) / 2
        mde = 100 * (math.exp((t975 + t80) * half_log / t975) - 1)
        assert d["detectable_pct"] == pytest.approx(max(d["noise_floor_pct"], mde), rel=1e-6), key
    for m in ("TTFT P50", "TTFT P99", "TPOT P50", "TPOT P99", "ITL P50", "ITL P99"):
        for c in summary["concurrency"]:
            assert deltas[f"fp8: {m} @c={c}"]["n"] == summary["trials"]
    assert summary["throughput_delta_label"] in ("within noise", "better", "worse")
    assert summary["throughput_delta_n"] == summary["trials"] and summary["throughput_detectable_pct"] > 0
    assert summary["noise_floor_pct"] is not None and summary["noise_floor_pct"] >= 0
    lo, hi = summary["noise_floor_iqr_pct"]
    assert lo <= summary["noise_floor_pct"] <= hi


def test_auto_preempts_above_its_kv_limit(summary, native_fp8, not_measured):
    if not native_fp8:
        return not_measured(summary, "01", "preemptions_auto", "preemptions_fp8")
    # at c=16 the mix holds about 94 blocks in flight, more than auto's 64: auto preempts, at least as often as fp8
    assert summary["preemptions_auto"] > 0
    assert summary["preemptions_auto"] >= summary["preemptions_fp8"]


def test_latency_and_throughput_recorded(summary, native_fp8, not_measured):
    if not native_fp8:
        return not_measured(
            summary, "01", *(f"{m}_{d}" for m in ("output_tok_s", "ttft_p50_ms") for d in ("auto", "fp8"))
        )
    for d in ("auto", "fp8"):
        assert summary[f"output_tok_s_{d}"] > 0 and summary[f"total_tok_s_{d}"] > summary[f"output_tok_s_{d}"]
        for m in ("ttft", "tpot", "itl"):
            p50, p99 = summary[f"{m}_p50_ms_{d}"], summary[f"{m}_p99_ms_{d}"]
            assert 0 < p50 <= p99


def test_open_loop_rate_achieved(summary, native_fp8, not_measured):
    if not native_fp8:
        return not_measured(summary, "01", "open_loop", "open_loop_send_lag_max_ms")
    assert summary["open_loop"], "no open-loop phases recorded"
    for row in summary["open_loop"]:
        assert row["achieved_rate"] == pytest.approx(row["scheduled_rate"], rel=0.05), row
    assert summary["open_loop_send_lag_max_ms"] < 250


def test_roofline_bandwidth(summary, native_fp8, not_measured):
    if not native_fp8:
        return not_measured(summary, "01", "bandwidth_gbs", "bandwidth_source")
    assert summary["bandwidth_gbs"] > 0 and not math.isnan(summary["bandwidth_gbs"])
    assert summary["bandwidth_source"] in ("measured", "parameter")


def test_both_methods_on_the_same_engines(summary, native_fp8, not_measured):
    if not native_fp8:
        return not_measured(summary, "01", "naive_concurrency")
    # the client that does not read the stream ran beside the streamed closed loop (claim 8 of the audit)
    assert summary["naive_concurrency"] and set(summary["naive_concurrency"]) <= set(summary["concurrency"])
    for c in summary["naive_concurrency"]:
        d = summary["deltas"][f"fp8: output tok/s (no stream) @c={c}"]
        assert d["lo_pct"] <= d["delta_pct"] <= d["hi_pct"]
        assert (d["label"] == "within noise") == (d["lo_pct"] <= 0 <= d["hi_pct"])


@pytest.fixture(scope="module")
def report_dir(summary, tmp_path_factory):
    """The folder this module's run wrote (``run_nb`` runs each notebook into a fresh folder of the session's
    temporary root): the one whose summary is this run's."""
    hits = {
        f.parent.resolve()  # pytest's "<name>current" links name the same folder
        for f in tmp_path_factory.getbasetemp().glob(f"*/{NB.stem}.summary.json")
        if json.loads(f.read_text()) == summary
    }
    # one folder, or two with the same summary where test_degraded.py's run said the same (FP8LAB_NATIVE_FP8=0 set for
    # the whole session gives both runs the switch's reason): either holds this run's rows
    assert hits, summary
    return min(hits)


def test_the_audit_reads_the_rows_this_run_wrote(summary, report_dir, tmp_path, native_fp8):
    """Issue 16: a study runs, then the audit reads the rows that run just wrote, by field. The rows carry the
    run's own numbers; claims 5, 24 and 3b read them (``read_from: rows``), never the flat summary's keys; a rows
    file whose producer renamed a field value the audit selects on leaves those claims without evidence instead of
    falling back to the summary (a renamed producer field fails this test). The reduced page (no kernel) writes no
    rows and opens with its verdict, the not-measured sentence; the audit finds no serving evidence in it."""
    if not native_fp8:
        assert not (report_dir / f"{NB.stem}.rows.json").exists()
        page = (report_dir / f"{NB.stem}.html").read_text()
        verdict = page[page.index('<h2 id="verdict">') :]  # the first section, as the index's link expects
        assert page.index('<h2 id="verdict">') < page.index("Parameters")
        assert "not measured on this device" in verdict[:200] and "formula" in verdict[:3000]
        mix = audit.safe(audit.rule_mix, audit.load_report(report_dir))
        assert mix.verdict == audit.NOT_TESTABLE, mix.measured
        return
    rows = st.read_rows(report_dir / f"{NB.stem}.rows.json")  # validated on read as on write
    assert st.read_parquet(report_dir / f"{NB.stem}.rows.parquet") == rows
    assert not list(report_dir.glob(".*running*"))  # renamed with the summary
    assert {r["evidence"] for r in rows} == {"cpu analogue"} and rows[0]["model"] == "fp8lab-tiny-qwen3"
    for c in summary["concurrency"]:
        d = summary["deltas"][f"fp8: output tok/s @c={c}"]
        r = st.one(rows, metric="output_tok_s", setting="closed loop", concurrency=c, kv_dtype="fp8", baseline="auto")
        assert (r["value"], r["ci_low"], r["ci_high"], r["n"]) == (d["delta_pct"], d["lo_pct"], d["hi_pct"], d["n"])
        assert r["unit"] == "%" and r["beyond_noise"] == d["beyond_noise_floor"]
    rep = audit.load_report(report_dir)
    assert rep.study_rows(audit.pages.SERVING) == rows
    mix = audit.rule_mix(rep)
    assert mix.verdict != audit.NOT_TESTABLE, mix.measured
    c = mix.details["concurrency"]
    for name in audit.CLAIM5:
        metric, setting = audit.SERVING_DELTAS[name]
        r = st.one(rows, metric=metric, setting=setting, concurrency=c, kv_dtype="fp8", baseline="auto")
        got = mix.details[name]
        assert got["read_from"] == "rows" and (got["delta_pct"], got["lo_pct"], got["hi_pct"]) == (
            r["value"],
            r["ci_low"],
            r["ci_high"],
        )
    head = max(summary["concurrency"])
    pooled = {
        (d, q): st.one(rows, metric=f"ttft_{q}_pooled", kv_dtype=d, concurrency=head)["value"]
        for d in ("auto", "fp8")
        for q in ("p50", "p99")
    }
    assert pooled[("fp8", "p50")] == summary["ttft_p50_ms_fp8"]
    spread = audit.rule_ttft_spread(rep)
    assert spread.details["ratio"] == pytest.approx(
        (pooled[("fp8", "p99")] - pooled[("fp8", "p50")]) / (pooled[("auto", "p99")] - pooled[("auto", "p50")])
    )
    mem = audit.rule_total_memory(rep)
    peak = {d: st.one(rows, metric="mem_peak_gib", kv_dtype=d)["value"] for d in ("auto", "fp8")}
    assert mem.details["engine_drop"] == pytest.approx(1 - peak["fp8"] / peak["auto"])
    ev = audit.load_evidence(report_dir, (), options_files=None, introspect_installed=False)
    found = {r["id"]: r for r in audit.audit(ev)}
    assert found["5"]["by_report"] == {rep.label: f"{mix.verdict} (analogue)"}  # a CPU run: never GPU evidence
    what = audit.evidence_frame(ev).set_index("evidence").loc[f"report {rep.label}: {NB.stem}", "what"]
    assert f"typed rows by field ({NB.stem}.rows.json)" in what
    # a producer that renamed what the audit selects on: no evidence, and no quiet fallback to the flat summary
    renamed = tmp_path / report_dir.name
    shutil.copytree(report_dir, renamed)
    moved = [{**r, "setting": "closed-loop" if r["setting"] == "closed loop" else r["setting"]} for r in rows]
    st.write_rows(moved, renamed / f"{NB.stem}.rows.json")
    gone = audit.safe(audit.rule_mix, audit.load_report(renamed))
    assert gone.verdict == audit.NOT_TESTABLE and "serving (01) rows" in gone.measured, gone.measured
