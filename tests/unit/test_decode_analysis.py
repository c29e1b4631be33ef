"""Study 06's analysis (fp8lab.decode: point, fit, crossover, roofline and capacity tables, summary, verdict) on
decode rows written here from lines chosen by hand: a stored run is plain data, so the analysis runs on it as
it would on a measured one. Expected numbers come from the chosen lines or from an independent computation
in the test (numpy.polyfit, scipy.stats, a root search on the regression's confidence band), never from
fp8lab.stats."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as sps

from fp8lab import decode, roofline
from fp8lab.paths import TINY_MODEL_DIR

CTX = (128, 256, 512, 1024, 1536)
REPS = 5
# per-repetition offsets (ms), summing to zero: each dtype's mean over the repetitions is its line exactly
JIT_AUTO = (-0.002, -0.001, 0.0, 0.001, 0.002)
JIT_FP8 = (0.001, -0.001, 0.002, -0.002, 0.0)
# per-context offsets of fp8 (ms): scatter about the line, so the fits have residuals
SCATTER = (0.004, -0.006, 0.003, 0.002, -0.003)

Line = Callable[[float], float]


def _spec(batches=(1,), kv_cache_gib=0.25) -> dict:
    s = decode.DecodeSpec(
        model=str(TINY_MODEL_DIR),
        contexts=CTX,
        batches=batches,
        reps=REPS,
        decode_tokens=16,
        kv_cache_gib=kv_cache_gib,
        max_model_len=2048,
        enforce_eager=True,
    )
    return dataclasses.asdict(s)


def _rows(batch: int, auto: Line, fp8: Line, scatter=SCATTER) -> list[dict]:
    rows = []
    for i, c in enumerate(CTX):
        for rep in range(REPS):
            for d, ms in (("auto", auto(c) + JIT_AUTO[rep]), ("fp8", fp8(c) + scatter[i] + JIT_FP8[rep])):
                rows.append(
                    {
                        "batch": batch,
                        "context_len": c,
                        "rep": rep,
                        "kv_dtype": d,
                        "step_s": ms / 1e3,
                        "full_batch": True,
                    }
                )
    rows.append({**rows[0], "rep": -1, "step_s": 1.0})  # a warm-up row: never analysed
    return rows


def _run(tmp_path, lines: dict[int, tuple[Line, Line]] | None = None, rows=None, engines=None) -> decode.DecodeRun:
    import pandas as pd

    lines = lines or {}
    rows = rows if rows is not None else [r for b, (a, f) in lines.items() for r in _rows(b, a, f)]
    spec = _spec(tuple(sorted({r["batch"] for r in rows})))
    return decode.DecodeRun(
        tmp_path,
        {"study": decode.STUDY, "spec": spec},
        pd.DataFrame(rows),
        engines or {},
        {"device": "test rows", "vllm": "none"},
        True,
    )


def _auto(c):
    return 1.0 + 0.002 * c


def _diff_fit(fp8_minus_auto: Line, scatter=SCATTER):
    """The line through the per-context mean differences, by numpy: (slope, intercept, residual sd, x, y)."""
    x = np.array(CTX, float)
    y = np.array([fp8_minus_auto(c) + s for c, s in zip(CTX, scatter, strict=True)])
    slope, icpt = np.polyfit(x, y, 1)
    s = math.sqrt(((y - icpt - slope * x) ** 2).sum() / (len(x) - 2))
    return slope, icpt, s, x, y


def _fieller_by_band(fp8_minus_auto: Line, lo: float, hi: float):
    """The root of the fitted difference and the x where its 95% confidence band touches zero (root search)."""
    slope, icpt, s, x, _ = _diff_fit(fp8_minus_auto)
    n, xbar, sxx = len(x), x.mean(), ((x - x.mean()) ** 2).sum()
    t = sps.t.ppf(0.975, n - 2)

    def g(x0):
        return abs(icpt + slope * x0) - t * s * math.sqrt(1 / n + (x0 - xbar) ** 2 / sxx)

    root = -icpt / slope
    return root, optimize.brentq(g, lo, root), optimize.brentq(g, root, hi)


def _cross(run) -> dict:
    t = decode.crossover_table(run)
    assert len(t) == 1
    return t.iloc[0].to_dict()


def _summary(run, bw=None) -> dict:
    return decode.summary(run, bw)


# ---------------------------------------------------------------------------------------------- points
def test_point_table_ratio_is_the_paired_t_interval(tmp_path):
    def fp8(c):
        return 1.2 + 0.0015 * c

    run = _run(tmp_path, {1: (_auto, fp8)})
    pts = decode.point_table(run).set_index("context_len")
    assert list(pts.index) == list(CTX) and (pts.n == REPS).all() and pts.full_batch.all()
    for i, c in enumerate(CTX):
        a = np.array([_auto(c) + j for j in JIT_AUTO])
        f = np.array([fp8(c) + SCATTER[i] + j for j in JIT_FP8])
        lr = np.log(f / a)
        lo, hi = sps.t.interval(0.95, REPS - 1, loc=lr.mean(), scale=sps.sem(lr))
        p = pts.loc[c]
        assert p.auto_step_ms == pytest.approx(_auto(c)) and p.fp8_step_ms == pytest.approx(fp8(c) + SCATTER[i])
        assert p.ratio == pytest.approx(math.exp(lr.mean()), rel=1e-9)
        assert (p.ratio_ci_low, p.ratio_ci_high) == pytest.approx((math.exp(lo), math.exp(hi)), rel=1e-9)
        assert p.ci_half_width_pct == pytest.approx(50 * (math.exp(hi) - math.exp(lo)), rel=1e-9)
        noise = max(100 * np.median(np.abs(x[1:] / x[:-1] - 1)) for x in (a, f))
        assert p.self_noise_pct == pytest.approx(noise, rel=1e-9)
        assert p.beyond_noise == bool((lo > 0 or hi < 0) and abs(math.exp(lr.mean()) - 1) * 100 > noise)
    # at 128 tokens fp8 is slower by 1.392/1.256 - 1 = 10.8%, at 1536 faster: 3.501/4.072 - 1 = -14.0%
    assert pts.loc[128].ratio > 1.1 and pts.loc[1536].ratio < 0.87
    assert pts.loc[128].beyond_noise and pts.loc[1536].beyond_noise


def test_point_table_skips_unpaired_points(tmp_path):
    rows = [r for r in _rows(1, _auto, _auto) if not (r["context_len"] == 512 and r["kv_dtype"] == "fp8")]
    pts = decode.point_table(_run(tmp_path, rows=rows))
    assert 512 not in set(pts.context_len) and len(pts) == len(CTX) - 1


# ------------------------------------------------------------------------------------------------ fits
def test_fit_table_is_ols_with_t_intervals(tmp_path):
    def fp8(c):
        return 1.2 + 0.0015 * c

    run = _run(tmp_path, {1: (_auto, fp8), 8: (lambda c: 2 * _auto(c), lambda c: 2 * fp8(c))})
    fits = decode.fit_table(run).set_index(["kv_dtype", "batch"])
    assert len(fits) == 4
    t3 = 3.1824463052837078  # t(0.975, 3): 5 contexts, 2 coefficients
    x = np.array(CTX, float)
    for b, k in ((1, 1.0), (8, 2.0)):
        # auto: no scatter about its line, so it is fitted exactly (a zero-width interval)
        f = fits.loc[("auto", b)]
        assert (f.a_ms, f.b_ms_per_token) == pytest.approx((k * 1.0, k * 0.002), rel=1e-9)
        assert f.b_ms_per_token_ci_high - f.b_ms_per_token_ci_low == pytest.approx(0, abs=1e-12)
        # fp8: scatter of +-6 us about 1.2 + 0.0015 c; compare with scipy's regression
        y = np.array([k * fp8(c) + s for c, s in zip(CTX, SCATTER, strict=True)])
        ref = sps.linregress(x, y)
        f = fits.loc[("fp8", b)]
        assert f.n_points == 5
        assert (f.a_ms, f.b_ms_per_token) == pytest.approx((ref.intercept, ref.slope), rel=1e-9)
        assert f.b_ms_per_ktoken == pytest.approx(1e3 * ref.slope)
        assert (f.b_ms_per_token_ci_low, f.b_ms_per_token_ci_high) == pytest.approx(
            (ref.slope - t3 * ref.stderr, ref.slope + t3 * ref.stderr), rel=1e-9
        )
        assert (f.a_ms_ci_low, f.a_ms_ci_high) == pytest.approx(
            (ref.intercept - t3 * ref.intercept_stderr, ref.intercept + t3 * ref.intercept_stderr), rel=1e-9
        )
        assert f.b_ms_per_token_ci_low < k * 0.0015 < f.b_ms_per_token_ci_high  # the true slope is covered


def test_fit_table_needs_three_contexts(tmp_path):
    rows = [r for r in _rows(1, _auto, _auto) if r["context_len"] in (128, 256)]
    assert decode.fit_table(_run(tmp_path, rows=rows)).empty


# ------------------------------------------------------------------------------------------ crossovers
def test_crossover_inside_the_grid(tmp_path):
    # fp8 = 1.5 + 0.001 c against auto = 1 + 0.002 c: the difference 0.5 - 0.001 c crosses zero at 500 tokens
    def fp8(c):
        return 1.5 + 0.001 * c

    c = _cross(_run(tmp_path, {1: (_auto, fp8)}))
    root, lo, hi = _fieller_by_band(lambda x: fp8(x) - _auto(x), -1e4, 1e4)
    assert c["status"] == "in_grid" and c["n_points"] == 5
    assert c["context_len"] == pytest.approx(root, rel=1e-9) and abs(root - 500) < 10
    assert (c["ci_low"], c["ci_high"]) == pytest.approx((lo, hi), rel=1e-6)
    assert c["ci_low"] < 500 < c["ci_high"] and c["ci_high"] - c["ci_low"] < 50
    slope, icpt, *_ = _diff_fit(lambda x: fp8(x) - _auto(x))
    assert c["diff_slope_ms_per_ktoken"] == pytest.approx(1e3 * slope) and c["diff_at_min_ms"] == pytest.approx(
        icpt + slope * 128
    )


def test_crossover_past_the_grid_is_an_extrapolation(tmp_path):
    # the difference 0.5 - 0.0002 c crosses zero at 2,500 tokens, past the largest context measured (1,536)
    def fp8(c):
        return 1.5 + 0.0018 * c

    run = _run(tmp_path, {1: (_auto, fp8)})
    c = _cross(run)
    root, lo, hi = _fieller_by_band(lambda x: fp8(x) - _auto(x), -1e5, 1e5)
    assert c["status"] == "above_grid"
    assert c["context_len"] == pytest.approx(root, rel=1e-9) and abs(root - 2500) < 100
    assert (c["ci_low"], c["ci_high"]) == pytest.approx((lo, hi), rel=1e-6)
    assert max(CTX) < c["ci_low"] < 2500 < c["ci_high"]
    assert c["ci_high"] - c["context_len"] > c["context_len"] - c["ci_low"]  # extrapolated: longer on the far side
    line = next(v for v in decode.verdict(_summary(run)) if v.startswith("Batch 1"))
    assert f"{c['context_len']:,.0f} tokens [{c['ci_low']:,.0f}, {c['ci_high']:,.0f}]" in line
    assert "past the grid: an extrapolation" in line


def test_fp8_faster_everywhere_crossover_below_the_grid(tmp_path):
    # the difference -0.1 - 0.0002 c is negative over the whole grid and would cross zero at -500 tokens
    def fp8(c):
        return _auto(c) - 0.1 - 0.0002 * c

    run = _run(tmp_path, {1: (_auto, fp8)})
    c = _cross(run)
    root, lo, hi = _fieller_by_band(lambda x: fp8(x) - _auto(x), -1e5, 1e5)
    assert c["status"] == "below_grid"
    assert c["context_len"] == pytest.approx(root, rel=1e-9) and c["context_len"] < min(CTX)
    assert (c["ci_low"], c["ci_high"]) == pytest.approx((lo, hi), rel=1e-6)
    assert c["diff_at_min_ms"] < 0
    assert "Batch 1: fp8 is faster at every measured context by the fit." in decode.verdict(_summary(run))


def test_no_crossover_when_fp8_is_slower_and_its_slope_larger(tmp_path):
    def fp8(c):
        return _auto(c) + 0.1 + 0.0002 * c

    run = _run(tmp_path, {1: (_auto, fp8)})
    c = _cross(run)
    assert c["status"] == "none" and c["context_len"] is None and c["ci_low"] is None and c["ci_high"] is None
    assert c["diff_at_min_ms"] > 0 and c["diff_slope_ms_per_ktoken"] > 0
    line = next(v for v in decode.verdict(_summary(run)) if v.startswith("Batch 1"))
    assert "no crossover" in line


def test_unbounded_fieller_interval_when_the_slope_difference_is_not_resolved(tmp_path):
    # the difference 0.05 - 0.00005 c (root 1,000 tokens) under scatter of +-40 us: the slope of the difference,
    # -5e-5 ms/token, is within its own 95% interval of zero, so no bounded interval exists for the root
    scatter = (0.04, -0.04, -0.04, 0.04, -0.04)

    def fp8(c):
        return _auto(c) + 0.05 - 0.00005 * c

    rows = _rows(1, _auto, fp8, scatter)
    c = _cross(_run(tmp_path, rows=rows))
    slope, icpt, s, x, _ = _diff_fit(lambda v: fp8(v) - _auto(v), scatter)
    se = s / math.sqrt(((x - x.mean()) ** 2).sum())
    assert slope < 0 and abs(slope) < sps.t.ppf(0.975, 3) * se  # not resolved (checked independently)
    assert c["context_len"] == pytest.approx(-icpt / slope, rel=1e-9)
    assert c["status"] == ("in_grid" if min(CTX) <= c["context_len"] <= max(CTX) else "above_grid")
    assert c["ci_low"] is None and c["ci_high"] is None


# -------------------------------------------------------------------------------- roofline and capacity
def test_roofline_fraction_is_bound_over_measured_step(tmp_path):
    run = _run(tmp_path, {4: (_auto, lambda c: 1.2 + 0.0015 * c)})
    bw = 50.0  # GB/s
    roof = decode.roofline_table(run, bw).set_index(["kv_dtype", "context_len"])
    w = roofline.weight_bytes_per_step(str(TINY_MODEL_DIR))
    # tiny model: 6 layers x (K + V) x 2 KV heads x 64 dims = 1,536 elements a token: 3,072 B bf16, 1,536 B fp8
    for d, per_token in (("auto", 3072), ("fp8", 1536)):
        for i, c in enumerate(CTX):
            kv = 4 * (c + 16 / 2) * per_token  # the batch's KV at the window's mean context (16 decode tokens)
            bound_ms = (w + kv) / (bw * 1e9) * 1e3
            step = _auto(c) if d == "auto" else 1.2 + 0.0015 * c + SCATTER[i]
            r = roof.loc[(d, c)]
            assert r.bound_ms == pytest.approx(bound_ms, rel=1e-12)
            assert r.fraction == pytest.approx(bound_ms / step, rel=1e-9)


def _engine(num_blocks, block_size=128, status="ok"):
    return {
        "status": status,
        "num_blocks": num_blocks,
        "block_size": block_size,
        "attention_backend": ["CPU_ATTN"],
        "cuda_graphs": False,
        "engine_start_s": 1.0,
        "mem_per_device_after_start_bytes": [2**30],
    }


def test_capacity_table_against_the_formula(tmp_path):
    # 0.25 GiB = 268,435,456 B; a 128-token block holds 128 x 3,072 = 393,216 B (auto), 196,608 B (fp8)
    # -> 682 and 1,365 blocks
    engines = {"auto": _engine(682), "fp8": _engine(1365)}
    run = _run(tmp_path, {1: (_auto, _auto)}, engines=engines)
    cap = decode.capacity_table(run).set_index("kv_dtype")
    assert cap.predicted_blocks.to_dict() == {"auto": 682, "fp8": 1365} and cap.exact.all()
    assert cap.attention_backend.to_dict() == {"auto": "CPU_ATTN", "fp8": "CPU_ATTN"}
    assert _summary(run)["capacity_exact"] is True
    off = _run(tmp_path, {1: (_auto, _auto)}, engines={"auto": _engine(682), "fp8": _engine(1364)})
    assert _summary(off)["capacity_exact"] is False
    assert "KV blocks differ from the formula" in " ".join(decode.verdict(_summary(off)))


def test_no_crossover_when_fp8_is_faster_only_at_short_contexts(tmp_path):
    # fp8's slope is the larger: the difference -0.1 + 0.0001 c is negative below ~1,000 tokens and positive above.
    # fp8 never *becomes* faster as the context grows, and it is not faster at every measured context either.
    def fp8(c):
        return _auto(c) - 0.1 + 0.0001 * c

    run = _run(tmp_path, {1: (_auto, fp8)})
    c = _cross(run)
    assert c["status"] == "none" and c["context_len"] is None and c["ci_low"] is None and c["ci_high"] is None
    slope, icpt, *_ = _diff_fit(lambda x: fp8(x) - _auto(x))
    assert c["diff_at_min_ms"] == pytest.approx(icpt + slope * min(CTX)) and c["diff_at_min_ms"] < 0
    assert c["diff_at_max_ms"] == pytest.approx(icpt + slope * max(CTX)) and c["diff_at_max_ms"] > 0
    line = next(v for v in decode.verdict(_summary(run)) if v.startswith("Batch 1"))
    assert "every measured context" not in line and "shortest contexts" in line and "no crossover" in line


def test_no_crossover_when_fp8_is_faster_everywhere_but_its_slope_larger(tmp_path):
    # the difference -0.5 + 0.0001 c: fp8 faster over the whole grid, its advantage shrinking with context
    def fp8(c):
        return _auto(c) - 0.5 + 0.0001 * c

    run = _run(tmp_path, {1: (_auto, fp8)})
    c = _cross(run)
    assert c["status"] == "none" and c["context_len"] is None
    assert c["diff_at_min_ms"] < c["diff_at_max_ms"] < 0
    line = next(v for v in decode.verdict(_summary(run)) if v.startswith("Batch 1"))
    assert "fp8 is faster at every measured context by the fit, but" in line and "no crossover" in line


def test_summary_is_valid_json_when_crossovers_mix_statuses(tmp_path):
    # one batch per kind of crossover row: in the grid with an interval, none, and unresolved (no interval).
    # A table mixing None and numbers in a column turns the None into NaN, which is not JSON.
    noisy = (0.04, -0.04, -0.04, 0.04, -0.04)
    rows = (
        _rows(1, _auto, lambda c: 1.5 + 0.001 * c)
        + _rows(4, _auto, lambda c: _auto(c) + 0.1 + 0.0002 * c)
        + _rows(8, _auto, lambda c: _auto(c) + 0.05 - 0.00005 * c, noisy)
    )
    run = _run(tmp_path, rows=rows)
    s = _summary(run)
    text = json.dumps(s, allow_nan=False)  # raises on NaN or inf
    cross = {c["batch"]: c for c in json.loads(text)["crossovers"]}
    assert cross[1]["status"] == "in_grid" and cross[1]["ci_low"] < 500 < cross[1]["ci_high"]
    assert cross[4]["status"] == "none" and cross[4]["context_len"] is None and cross[4]["ci_low"] is None
    assert cross[8]["context_len"] > 0 and cross[8]["ci_low"] is None and cross[8]["ci_high"] is None
    lines = decode.verdict(s)
    assert not any("nan" in v.lower() for v in lines)
    assert any(v.startswith("Batch 8") and "(interval unbounded)" in v for v in lines)


def test_min_detectable_is_the_median_half_width(tmp_path):
    # 2 batches x 5 contexts = 10 points: the median of an even count is the mean of the two middle values
    run = _run(
        tmp_path, {1: (_auto, lambda c: 1.2 + 0.0015 * c), 4: (lambda c: 3 * _auto(c), lambda c: 3.3 + 0.005 * c)}
    )
    half_widths = []
    for k, fp8 in ((1, lambda c: 1.2 + 0.0015 * c), (3, lambda c: 3.3 + 0.005 * c)):
        for i, c in enumerate(CTX):
            lr = np.log(
                [(fp8(c) + SCATTER[i] + jf) / (k * _auto(c) + ja) for ja, jf in zip(JIT_AUTO, JIT_FP8, strict=True)]
            )
            lo, hi = sps.t.interval(0.95, REPS - 1, loc=lr.mean(), scale=sps.sem(lr))
            half_widths.append(50 * (math.exp(hi) - math.exp(lo)))
    hw = sorted(half_widths)
    assert len(hw) == 10 and hw[4] < hw[5]  # the lower and upper medians differ
    s = _summary(run)
    assert s["min_detectable_pct"] == pytest.approx((hw[4] + hw[5]) / 2, rel=1e-9)
    assert s["max_ci_half_width_pct"] == pytest.approx(hw[-1], rel=1e-9)


@pytest.mark.parametrize("offset", [0.1, -0.1])
def test_no_crossover_for_parallel_lines(tmp_path, offset):
    # fp8 = auto + offset at every context: the difference is flat, so there is no crossover. Its fitted slope is
    # zero up to rounding (~1e-16 ms/token, of either sign), which must not turn into a root at ~1e17 tokens.
    run = _run(tmp_path, rows=_rows(1, _auto, lambda c: _auto(c) + offset, scatter=(0.0,) * len(CTX)))
    c = _cross(run)
    assert c["status"] == "none" and c["context_len"] is None and c["ci_low"] is None
    assert c["diff_at_min_ms"] == pytest.approx(offset) and c["diff_at_max_ms"] == pytest.approx(offset)
    line = next(v for v in decode.verdict(_summary(run)) if v.startswith("Batch 1"))
    assert "no crossover" in line and ("every measured context" in line) == (offset < 0)


def test_a_point_measured_twice_keeps_the_last_row(tmp_path):
    # a resumed run can hold a (batch, context, rep, dtype) twice: the later measurement stands
    rows = _rows(1, _auto, _auto, scatter=(0.0,) * len(CTX))
    rows.append({**rows[0], "step_s": 5.0})  # rows[0]: batch 1, 128 tokens, rep 0, auto
    m = _run(tmp_path, rows=rows).measured()
    got = m[(m.context_len == 128) & (m.rep == 0) & (m.kv_dtype == "auto")]
    assert len(got) == 1 and got.step_ms.iloc[0] == pytest.approx(5000.0)
    assert len(m) == 2 * REPS * len(CTX)
