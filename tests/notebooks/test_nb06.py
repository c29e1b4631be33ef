"""Notebook 06 (decode speed) executed top to bottom by papermill on the test profile (``cpu-ci``, cpu-tiny with fewer repetitions); asserts on the
summary it wrote. The grid and the KV budget are the profile's, so the expectations hold for whichever small
grid it sets; the KV block counts are derived here from the model's config by hand (and by the formula).

Without the native FP8 KV kernel (``native_fp8`` False) the runner executes the reduced notebook instead
(:mod:`fp8lab.degrade`: an emulated cache cannot stand in for step time): each test then asserts what that page says
about its part: not measured and why, the formula's blocks marked predicted, no figure it did not measure, and an
audit that finds no decode evidence in it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fp8lab import audit, decode, kvmath
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


def test_every_point_has_a_ratio_with_its_interval(nb06, native_fp8, not_measured):
    params, _, s = nb06
    if not native_fp8:
        return not_measured(s, "06", "points", "min_detectable_pct", "max_ci_half_width_pct")
    for p in s["points"]:
        assert p["n"] == params["REPS"]
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
    fits = {(f["kv_dtype"], f["batch"]): f for f in s["fits"]}
    assert set(fits) == {(d, b) for d in params["KV_DTYPES"] for b in params["BATCHES"]}
    for f in fits.values():
        assert f["n_points"] == len(params["CONTEXTS"])
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
    cross = {c["batch"]: c for c in s["crossovers"]}
    assert set(cross) == set(params["BATCHES"])
    for c in cross.values():
        assert c["status"] in ("in_grid", "above_grid", "below_grid", "none")
        assert _finite(c["diff_at_min_ms"], c["diff_slope_ms_per_ktoken"])
        if c["status"] == "none":
            assert c["context_len"] is None and c["ci_low"] is None and c["ci_high"] is None
        else:
            assert _finite(c["context_len"])
            assert (c["ci_low"] is None) == (c["ci_high"] is None)
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
    assert {r["evidence"] for r in rows} == {"cpu analogue"} and {r["setting"] for r in rows} == {"decode step, eager"}
    rep = audit.load_report(folder)
    grid = audit.decode_grid(rep)
    assert [
        (p["batch"], p["context_len"], p["ratio"], p["ratio_ci_low"], p["ratio_ci_high"], p["read_from"]) for p in grid
    ] == [
        (p["batch"], p["context_len"], p["ratio"], p["ratio_ci_low"], p["ratio_ci_high"], "rows") for p in s["points"]
    ]
    assert f"+-{s['min_detectable_pct']:.2f}% step time" in audit.decode_detectable(rep)
    assert audit.safe(audit.rule_long_tpot, rep).verdict != audit.NOT_TESTABLE
