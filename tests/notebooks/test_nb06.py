"""Notebook 06 (decode speed) executed top to bottom by papermill on the test profile (``cpu-ci``: cpu-tiny's
engine-replicated design, 3 fresh engines per dtype in ABBA order in both arms, at batch 1); asserts on the summary it
wrote. The grid, the engines and the KV budget are the profile's, so the expectations hold for whichever small design
it sets; the KV block counts are derived here from the model's config by hand (and by the formula).

Without the native FP8 KV kernel (``native_fp8`` False) the runner executes the reduced notebook instead
(:mod:`fp8lab.report.degrade`: an emulated cache cannot stand in for step time): each test then asserts what that page says
about its part: not measured and why, the formula's blocks marked predicted, no figure it did not measure, and an
audit that finds no decode evidence in it."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from fp8lab import audit, decode, kvmath, stats
from fp8lab import summary_table as st
from fp8lab.paths import NOTEBOOKS_DIR

pytestmark = pytest.mark.slow

NB06 = NOTEBOOKS_DIR / "06_decode_speed.ipynb"


@pytest.fixture(scope="module")
def nb06(run_nb, tiny_model):
    params, summary = run_nb(NB06, {"MODEL": tiny_model})
    return params, decode.DecodeSpec.from_params(params), summary


def _finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def test_both_engines_ran_the_whole_grid(nb06, native_fp8, not_measured):
    params, spec, s = nb06
    if not native_fp8:  # no engine started: auto not run, fp8 unsupported with the reason
        return not_measured(s, "06", "engines_ok", "complete", "points")
    assert s["engines_ok"] == {"auto": True, "fp8": True} and s["engine_errors"] == {}
    assert s["complete"] is True
    assert s["n_reps"] == params["REPS"] and s["decode_tokens"] == params["DECODE_TOKENS"]
    assert s["cuda_graphs"] is False  # ENFORCE_EAGER on the CPU build
    grid = decode.plan(spec)
    want = {(int(r.batch), int(r.context_len)) for r in grid.itertuples() if r.measure}
    assert want == {(b, c) for b in params["BATCHES"] for c in params["CONTEXTS"]}  # the small grid fits whole
    assert {(p["batch"], p["context_len"]) for p in s["points"]} == want
    # issue 35: every engine of the schedule started fresh and measured the whole grid, in both arms
    assert s["replicated"] is True and s["engines_per_dtype"] == params["ENGINES"] == 3
    assert s["arms"] == params["ARMS"] and s["primary_arm"] == ("solo" if "solo" in params["ARMS"] else "colocated")
    assert len(s["engine_start_s"]) == 2 * params["ENGINES"] * len(params["ARMS"]) and not s["engine_failures"]
    assert s["deferred_sets"] == 0 and s["interval_over"] == "engine pairs"
    for arm in params["ARMS"]:
        assert {(p["batch"], p["context_len"]) for p in s["points_by_arm"][arm]} == want
    assert s["points_by_arm"][s["primary_arm"]] == s["points"]


def test_every_point_has_a_ratio_with_its_interval(nb06, native_fp8, not_measured):
    params, _, s = nb06
    if not native_fp8:
        return not_measured(s, "06", "points", "min_detectable_pct", "max_ci_half_width_pct")
    for p in s["points"]:
        assert p["n"] == p["n_engines"] == params["ENGINES"] and p["reps"] == params["REPS"]
        assert _finite(p["rep_level_half_width_pct"]) and p["rep_level_half_width_pct"] > 0
        assert _finite(p["auto_step_ms"], p["fp8_step_ms"], p["ratio"], p["ratio_ci_low"], p["ratio_ci_high"])
        assert p["auto_step_ms"] > 0 and p["fp8_step_ms"] > 0
        assert 0 < p["ratio_ci_low"] < p["ratio"] < p["ratio_ci_high"]
        # the half-width in percent is that of the interval written beside it
        assert p["ci_half_width_pct"] == pytest.approx(50 * (p["ratio_ci_high"] - p["ratio_ci_low"]))
        assert _finite(p["self_noise_pct"]) and p["self_noise_pct"] >= 0
        assert p["beyond_noise"] == (
            not p["ratio_ci_low"] <= 1 <= p["ratio_ci_high"] and abs(p["ratio"] - 1) * 100 > p["self_noise_pct"]
        )
    hw = sorted(p["ci_half_width_pct"] for p in s["points"])
    mid = len(hw) // 2
    assert s["min_detectable_pct"] == pytest.approx(hw[mid] if len(hw) % 2 else (hw[mid - 1] + hw[mid]) / 2)
    assert s["max_ci_half_width_pct"] == pytest.approx(hw[-1])


def test_kv_blocks_match_the_formula_and_backend_is_recorded(nb06, tiny_model, native_fp8, not_measured):
    params, _, s = nb06
    cfg = json.loads((Path(tiny_model) / "config.json").read_text())
    budget = int(params["KV_CACHE_GIB"] * 2**30)
    per_token = {"auto": 2, "fp8": 1}  # bytes per element: bfloat16, fp8
    if not native_fp8:  # the formula's blocks at the CPU block size 128, marked predicted (never measured here)
        for d, b in per_token.items():
            page = 128 * cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * b
            assert (
                s[f"{d}.predicted_num_blocks"]
                == budget // page
                == kvmath.predict_num_blocks(tiny_model, budget, 128, d)
            )
            assert s[f"{d}.predicted_kv_capacity_tokens"] == 128 * s[f"{d}.predicted_num_blocks"]
        assert s["fp8.predicted_num_blocks"] >= 2 * s["auto.predicted_num_blocks"]
        return not_measured(s, "06", "capacity", "capacity_exact")
    caps = {c["kv_dtype"]: c for c in s["capacity"]}
    assert set(caps) == {"auto", "fp8"} and s["capacity_exact"] is True
    for d, c in caps.items():
        bs = c["block_size"]
        page = bs * cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * per_token[d]
        assert c["num_blocks"] == c["predicted_blocks"] == budget // page
        assert c["num_blocks"] == kvmath.predict_num_blocks(tiny_model, budget, bs, d)
        assert isinstance(c["attention_backend"], str) and c["attention_backend"]  # the backend vLLM chose
    assert caps["fp8"]["num_blocks"] >= 2 * caps["auto"]["num_blocks"]


def test_fits_and_crossovers_are_present_and_finite(nb06, native_fp8, not_measured):
    params, _, s = nb06
    if not native_fp8:
        return not_measured(s, "06", "fits", "crossovers", "roofline", "bandwidth_gbs")
    fits = {(f["arm"], f["kv_dtype"], f["batch"]): f for f in s["fits"]}
    labels = [*params["KV_DTYPES"], "fp8-auto"]  # each dtype's line, and fp8's paired difference from auto's
    assert set(fits) == {(a, d, b) for a in params["ARMS"] for d in labels for b in params["BATCHES"]}
    for f in fits.values():
        assert f["n_points"] == len(params["CONTEXTS"]) and f["n_engines"] == params["ENGINES"]
        assert f["a_us_per_layer"] == pytest.approx(f["a_ms"] * 1e3 / 6)  # the shipped model's 6 layers
        assert _finite(
            f["a_ms"],
            f["a_ms_ci_low"],
            f["a_ms_ci_high"],
            f["b_ms_per_token"],
            f["b_ms_per_token_ci_low"],
            f["b_ms_per_token_ci_high"],
        )
        assert f["a_ms_ci_low"] < f["a_ms"] < f["a_ms_ci_high"]
        assert f["b_ms_per_token_ci_low"] < f["b_ms_per_token"] < f["b_ms_per_token_ci_high"]
        assert f["b_ms_per_ktoken"] == pytest.approx(1e3 * f["b_ms_per_token"])
    cross = {(c["arm"], c["batch"]): c for c in s["crossovers"]}
    assert set(cross) == {(a, b) for a in params["ARMS"] for b in params["BATCHES"]}
    lo, hi = min(params["CONTEXTS"]), max(params["CONTEXTS"])
    for c in cross.values():
        assert c["status"] in ("in_grid", "above_grid", "below_grid", "none") and c["n_engines"] == params["ENGINES"]
        assert _finite(c["diff_at_min_ms"], c["diff_slope_ms_per_ktoken"]) and c["interval_text"]
        if c["status"] in ("none", "below_grid"):  # no token count below the grid, never a negative one
            assert c["context_len"] is None and c["ci_low"] is None
        else:
            assert _finite(c["context_len"]) and c["context_len"] >= lo
        # the interval is stated within the measured contexts only
        assert c["ci_low"] is None or lo <= c["ci_low"] <= hi
        assert c["ci_high"] is None or lo <= c["ci_high"] <= hi
    effect = {(e["kv_dtype"], e["batch"]): e for e in s["arm_effect"]}
    assert set(effect) == {(d, b) for d in labels for b in params["BATCHES"]}
    for e in effect.values():
        assert e["n_rounds"] == params["ENGINES"]
        assert _finite(e["effect_ms"], e["effect_ms_ci_low"], e["effect_ms_ci_high"])
        assert e["effect_ms"] == pytest.approx(e["colocated_a_ms"] - e["solo_a_ms"])
    roof = s["roofline"]
    assert {(r["kv_dtype"], r["batch"], r["context_len"]) for r in roof} == {
        (d, p["batch"], p["context_len"]) for d in params["KV_DTYPES"] for p in s["points"]
    }
    assert all(_finite(r["fraction"]) and r["fraction"] > 0 for r in roof)
    assert _finite(s["bandwidth_gbs"]) and s["bandwidth_gbs"] > 0


def test_the_audit_reads_the_rows_this_run_wrote(nb06, tmp_path_factory, native_fp8):
    """Issue 16: the typed rows this run wrote carry each point's paired ratio, and the audit's decode claims read
    them by field (the same points, in the grid's order, as the flat summary's). The reduced page (no kernel)
    writes no rows and opens with its verdict, the not-measured sentence; the audit finds no decode evidence."""
    _, _, s = nb06
    folders = {  # the folder this run wrote (pytest's "<name>current" links name the same one)
        f.parent.resolve()
        for f in tmp_path_factory.getbasetemp().glob(f"*/{NB06.stem}.summary.json")
        if json.loads(f.read_text()) == s
    }
    assert len(folders) == 1, folders
    folder = folders.pop()
    if not native_fp8:
        assert not (folder / f"{NB06.stem}.rows.json").exists()
        page = (folder / f"{NB06.stem}.html").read_text()
        assert page.index('<h2 id="verdict">') < page.index("Parameters")  # the first section, as the index links it
        verdict = page[page.index('<h2 id="verdict">') :]
        assert "not measured on this device" in verdict[:200] and "decode step time" in verdict[:3000]
        rep = audit.load_report(folder)
        assert audit.safe(audit.rule_long_tpot, rep).verdict == audit.NOT_TESTABLE
        return
    rows = st.read_rows(folder / f"{NB06.stem}.rows.json")
    assert st.read_parquet(folder / f"{NB06.stem}.rows.parquet") == rows
    steps = [r for r in rows if r["metric"] == "decode_step_ms"]
    assert {r["evidence"] for r in steps} == {"cpu analogue"}
    assert {r["setting"] for r in steps} == {"decode step, eager, one engine at a time, 3 engines per dtype"}
    assert {r["n"] for r in steps} == {3}  # engine pairs
    cross = [r for r in rows if r["metric"] == "decode_crossover_tokens"]
    assert all(r["value"] >= min(p["context_len"] for p in s["points"]) for r in cross)
    rep = audit.load_report(folder)
    grid = audit.decode_grid(rep)
    assert [
        (p["batch"], p["context_len"], p["ratio"], p["ratio_ci_low"], p["ratio_ci_high"], p["read_from"]) for p in grid
    ] == [
        (p["batch"], p["context_len"], p["ratio"], p["ratio_ci_low"], p["ratio_ci_high"], "rows") for p in s["points"]
    ]
    # each point's change detectable at 80% power from its paired interval (t on n - 1 = 2 df), median and largest
    det = sorted(
        100 * math.expm1(stats.detectable_from_interval(math.log(p["ratio_ci_low"]), math.log(p["ratio_ci_high"]), 2))
        for p in s["points"]
    )
    assert audit.decode_detectable(rep) == (
        f"{statistics.median(det):.2f}% step time detectable at 80% power (median over the grid, largest "
        f"{det[-1]:.2f}%; paired t, n=3 per point)"
    )
    assert audit.safe(audit.rule_long_tpot, rep).verdict != audit.NOT_TESTABLE
