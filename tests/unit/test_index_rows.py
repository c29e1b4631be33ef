"""The index reads each study's key numbers by field from its typed rows (issue 16), no engine.

For one run, the numbers read from its rows (:func:`fp8lab.report.index.key_numbers_from_rows`) are the ones read
from its flat summary by key (:func:`~fp8lab.report.index.key_numbers_from_summary`), now with the interval's ``n``
and a signed change: Study 00 as the committed H200 report re-renders (no engine), Study 01 on the fake paired study
of the serving tests, Study 03 on hand-made rows, Studies 04, 06 and 07 from the committed H200 stores (reports/h200/records, real vLLM 0.26.0 runs)
under ``FP8LAB_STORE_ONLY``. A rows file whose producer renamed a metric makes the index leave that number out (the
summary still has its key: no fallback to it), and a rows file off the schema shows why and no numbers."""

from __future__ import annotations

import json
import re

import pytest
from test_metrics import _FakeEngine, _plan, engine  # noqa: F401 - the fake paired study of the serving tests

from fp8lab import serving
from fp8lab import summary_table as st
from fp8lab.keynumbers import fmt_number, fmt_row
from fp8lab.paths import REPO_ROOT
from fp8lab.report.index import key_numbers, key_numbers_from_summary, study_rows
from fp8lab.report.run import record_summary, write_index

H200 = REPO_ROOT / "reports" / "h200"
#: The H200 report's bandwidth (notebook 06 records it; the committed report ran with it).
BANDWIDTH_GBS = 4069.9173720405943


def _plain(text: str) -> str:
    """A rows-read value as the summary-read one writes it: no ``+`` sign, no ``, n = k`` in the interval."""
    return re.sub(r", n = [\d,]+\)", ")", text).replace("+", "")


def _same_numbers(stem: str, s: dict, rows: list) -> dict[str, str]:
    """The key numbers from ``rows``, after checking that they are the summary's (same labels, same order, same
    values but for :func:`_plain`) and that each interval names its ``n``."""
    flat, typed = key_numbers_from_summary(stem, s), key_numbers(stem, s, rows)
    assert [k for k, _ in typed] == [k for k, _ in flat]
    for (label, want), (_, got) in zip(flat, typed, strict=True):
        assert _plain(got) == want, label
        assert ("95% CI" not in got) or re.search(r", n = [\d,]+\)", got), label
    return dict(typed)


def _renamed(rows: list, metric: str, to: str = "scale_abs_diff") -> list:
    """``rows`` as a producer that renamed ``metric`` writes them (to a metric the index never reads for the study)."""
    return st.validate([{**r, "metric": to} if r["metric"] == metric else r for r in rows])


def _index_page(tmp_path, stem: str, s: dict, rows: list | None) -> str:
    """``index.html`` of a report folder holding the study's summary and (unless None) its rows."""
    record_summary(s, tmp_path / f"{stem}.summary.json", rows=rows)
    summary = {"profile": "h200", "notebooks": {stem: {"status": "ok", "summary": json.loads(json.dumps(s))}}}
    return write_index(tmp_path, summary).read_text()


# ---------------------------------------------------------------------------------------------- formatting
def _row(**kw):
    base = dict(study="serving", metric="output_tok_s", kv_dtype="fp8", setting="closed loop", concurrency=64, n=5)
    return st.make_row(**{**base, "evidence": "gpu", "device": "NVIDIA H200", "model": "qwen3-8b", **kw})


def test_fmt_row_signs_a_change_and_names_its_interval_and_n():
    up = _row(baseline="auto", value=13.15648, ci_low=12.71036, ci_high=13.60437, unit="%")
    assert fmt_row(up) == "+13.2 % (95% CI +12.7 to +13.6, n = 5)"
    down = _row(baseline="auto", value=-8.0045635, ci_low=-29.3408909, ci_high=6.4779203, n=3, unit="%")
    assert fmt_row(down) == "-8.00 % (95% CI -29.3 to +6.48, n = 3)"
    assert fmt_row(_row(metric="kv_capacity_tokens", value=174752, n=1, unit="tokens")) == "174,752 tokens"
    figure = _row(value=2475.53, ci_low=2400.0, ci_high=2500.0, unit="tok/s")  # a figure's interval: not signed
    assert fmt_row(figure) == "2,476 tok/s (95% CI 2,400 to 2,500, n = 5)"


# ------------------------------------------------------------------------------------------------ Study 00
def test_study_00_key_numbers_from_rows_are_the_summarys(h200_00):
    from fp8lab.capacity import study as s00

    got = _same_numbers(s00.NAME, h200_00.summary(), h200_00.rows())
    assert got["KV per token, auto → fp8 (fp8lab-tiny-qwen3)"] == "3,072 → 1,536 B/token"
    assert got["engines on record whose block count the formula predicted exactly"].endswith("(NVIDIA H200)")


# ------------------------------------------------------------------------------------------------ Study 01
@pytest.fixture
def serving_run(engine, tmp_path, monkeypatch):  # noqa: F811 - the fixture
    """The fake paired study (fp8's requests take 0.8 x as long): its flat summary and its rows."""
    monkeypatch.setenv("FP8LAB_RUNS", str(tmp_path / "runs"))
    plan = _plan(engine, capacity_factors=(0.5,))
    res = serving.run_study(plan, progress=False, engine_factory=lambda spec, log: _FakeEngine(spec, log, []))
    deltas, capacity = serving.delta_table(res), serving.capacity_table(res)
    _, search = serving.capacity_search(res)
    s = serving.summary_values(res, deltas, capacity, search, serving.open_loop_table(res))
    return json.loads(json.dumps(s, default=float)), serving.summary_rows(res, deltas, capacity, search)


def test_study_01_key_numbers_from_rows_are_the_summarys(serving_run):
    s, rows = serving_run
    got = _same_numbers("01_kv_dtype_auto_vs_fp8", s, rows)
    head = f"fp8 vs auto output throughput at concurrency {s['headline_concurrency']}"
    assert re.fullmatch(r"\+[\d.]+ % \(95% CI [+-][\d.]+ to \+[\d.]+, n = \d+\): (better|within noise)", got[head])
    assert f"n = {s['throughput_delta_n']})" in got[head]
    for label in ("KV capacity, auto → fp8", "ITL p50, auto → fp8", "peak device memory, auto → fp8", "trials"):
        assert label in got  # each read from a row (the pooled ITL P50 is a row since issue 16)
    assert got["trials"] == str(s["trials"])


def test_study_01_renamed_metric_leaves_its_number_out(serving_run, tmp_path):
    s, rows = serving_run
    stem = "01_kv_dtype_auto_vs_fp8"
    head = f"fp8 vs auto output throughput at concurrency {s['headline_concurrency']}"
    page = _index_page(tmp_path, stem, s, _renamed(rows, "kv_capacity_tokens"))
    flat = f"{s['capacity_tokens_auto']:,} → {s['capacity_tokens_fp8']:,} tokens"  # the summary still has it
    assert "KV capacity, auto → fp8" not in page and flat not in page and "peak device memory, auto → fp8" in page
    typed = dict(key_numbers(stem, s, _renamed(rows, "output_tok_s")))  # the headline concurrency's own metric
    assert not {head, "trials", "ITL p50, auto → fp8"} & set(typed) and "KV capacity, auto → fp8" in typed
    assert head in dict(key_numbers(stem, s))  # read from the summary only when there are no rows


def test_index_uses_the_rows_file_and_shows_a_bad_one(serving_run, tmp_path):
    s, rows = serving_run
    stem = "01_kv_dtype_auto_vs_fp8"
    page = _index_page(tmp_path / "rows", stem, s, rows)
    assert study_rows(tmp_path / "rows", stem) == rows
    assert ", n = " in page  # the interval's n: only the rows carry it
    old = _index_page(tmp_path / "old", stem, s, None)  # a report rendered before the rows existed
    assert study_rows(tmp_path / "old", stem) is None and "KV capacity, auto → fp8" in old and ", n = " not in old
    bad = tmp_path / "rows" / f"{stem}.rows.json"
    bad.write_text(json.dumps([{**rows[0], "unit": "furlongs"}]))
    write_index(tmp_path / "rows", {"profile": "h200", "notebooks": {stem: {"status": "ok", "summary": s}}})
    page = (tmp_path / "rows" / "index.html").read_text()
    assert "Key numbers not shown: 01_kv_dtype_auto_vs_fp8.rows.json" in page and "furlongs" in page
    assert "KV capacity" not in page and "<table class='nums'>" not in page


# ------------------------------------------------------------------------------------------------ Study 03
def test_study_03_key_numbers_from_hand_made_rows_are_the_committed_summarys():
    """Study 03's rows as quality.summary_rows writes them (setting the config's label), with the committed H200
    summary's numbers: the same key numbers; the verdicts (words) come from the summary either way."""
    stem = "03_quality_token_match"
    s = json.loads((H200 / f"{stem}.summary.json").read_text())
    at = {"study": "quality", "setting": "fp8", "kv_dtype": "fp8", "evidence": "gpu analogue"}
    at |= {"device": "NVIDIA H200", "model": s["model"]}
    top3 = (s["fp8.top3_match"], s["fp8.top3_ci_lo"], s["fp8.top3_ci_hi"])
    ppl = (s["fp8.delta_ppl_pct"], s["fp8.delta_ppl_pct_ci_lo"], s["fp8.delta_ppl_pct_ci_hi"])
    rows = st.validate(
        [
            st.make_row(
                **at, metric="top3_match", value=top3[0], ci_low=top3[1], ci_high=top3[2], n=40, unit="fraction"
            ),
            st.make_row(
                **at, metric="ppl", baseline="auto", value=ppl[0], ci_low=ppl[1], ci_high=ppl[2], n=64, unit="%"
            ),
        ]
    )
    got = _same_numbers(stem, s, rows)
    assert got["fp8: perplexity change"] == "+1.45 % (95% CI +1.12 to +1.75, n = 64)"  # the real model, 2026-12-03
    assert got["prompts"] == "40" == str(s["n_prompts"])
    assert "fp8: perplexity change" not in dict(key_numbers(stem, s, _renamed(rows, "ppl")))


# -------------------------------------------------------------------------------------- Studies 04, 06, 07
def _load(h200_study, name: str, **extra):
    """A study of the H200 report from the committed store: its flat summary (JSON-clean, as recorded) and rows."""
    _, s, rows = h200_study(name, **extra)
    return json.loads(json.dumps(s, default=str)), rows


def _load_06(h200_study, **extra):
    """Study 06 as committed (the 2026-11-30 run, one engine per dtype: profile h200-decode-2026-11) until the
    engine-replicated run of issue 35 is in the store."""
    _, s, rows = h200_study("06_decode_speed", profile="h200-decode-2026-11", **extra)
    return json.loads(json.dumps(s, default=str)), rows


def test_study_04_key_numbers_from_rows_are_the_summarys(h200_study, tmp_path):
    stem = "04_long_context_ramp_128k"
    s, rows = _load(h200_study, stem)
    got = _same_numbers(stem, s, rows)
    assert got["longest context the engine holds, auto → fp8"] == (
        f"{s['auto.longest_engine']:,} → {s['fp8.longest_engine']:,} tokens"
    )
    page = _index_page(tmp_path, stem, s, _renamed(rows, "longest_context"))
    assert "longest context the engine holds" not in page and s["fp8.longest_engine"]
    assert "KV budget" in page  # a run parameter, read from the summary in either case


def test_study_06_key_numbers_from_rows_are_the_summarys(h200_study, tmp_path):
    stem = "06_decode_speed"
    s, rows = _load_06(h200_study, BANDWIDTH_GBS=BANDWIDTH_GBS)
    got = _same_numbers(stem, s, rows)
    n = len(s["points"])
    assert got["grid points (batch x context) measured by both dtypes"] == str(n) and n == 20
    assert got["KV blocks as the formula predicts"] == "yes" and s["capacity_exact"] is True
    page = _index_page(tmp_path, stem, s, _renamed(rows, "decode_step_ms"))
    assert "beyond noise" not in page and "grid points" not in page and "KV blocks as the formula predicts" in page
    no_formula = dict(key_numbers(stem, s, _renamed(rows, "num_blocks_formula")))
    assert "KV blocks as the formula predicts" not in no_formula  # not "no": there is nothing to compare


def test_study_07_key_numbers_from_rows(h200_study, tmp_path):
    """Study 07's index showed its summary's first scalar keys; from its rows it shows each workload's knees, the
    largest |fp8 - auto| hit rate while auto holds and fp8's largest gain (the summary's own numbers), and keeps the
    summary keys rows cannot carry (the claim's words, the block size, the counter turns) under their old labels."""
    stem = "07_prefix_cache"
    s, rows = _load(h200_study, stem)
    flat, got = dict(key_numbers(stem, s)), dict(key_numbers(stem, s, rows))
    for k in ("block_size", "claim_verdict", "claim_evidence", "counter_turns", "counter_turns_complete"):
        assert got[k] == flat[k]
    knees = {(k["workload"], k["kv_dtype"]): k for k in s["knees"]}
    for w in ("chat", "system", "json"):
        held = [int(knees[w, d]["measured_last_held"]) for d in ("auto", "fp8")]
        knee = got[f"{w}: most active conversations that keep their prefix hits, auto → fp8"]
        assert knee.startswith(f"{held[0]} → {held[1]} conversations (the replay predicts ")
        inside = got[f"{w}: largest |fp8 − auto| hit rate while auto holds"]
        assert inside == f"{s[f'{w}.max_abs_dhit_pp_inside']:g} pp"
        gain = s[f"{w}.gain"]
        label = f"{w}: largest fp8 − auto hit rate, at {int(gain['n_active'])} active"
        if gain.get("dhit_deterministic"):  # every trial gave the same difference: no interval (not +-0.0)
            assert _plain(got[label]) == f"{fmt_number(gain['dhit_pp'])} pp"
        else:
            assert _plain(got[label]).startswith(f"{fmt_number(gain['dhit_pp'])} pp (95% CI ")
    page = _index_page(tmp_path, stem, s, _renamed(rows, "prefix_knee_measured"))
    assert "keep their prefix hits" not in page and "while auto holds</th>" not in page and "claim_verdict" in page
