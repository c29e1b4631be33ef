"""Study 06's statistics with the engine as the experimental unit (issue 35): per-point ratios, fitted lines, the
crossover and the co-location effect, each with an interval over fresh engines (pure functions of measured rows).

The design (:mod:`fp8lab.engine.schedule`): every KV dtype is started ``R`` times (rounds), in ABBA order; round
``k``'s auto and fp8 engines are a pair, adjacent in time; each engine measures every point ``reps`` times. The
rows (one per measurement) carry ``arm``, ``round``, ``kv_dtype``, ``batch``, ``context_len``, ``rep``,
``step_ms``.

**Why per-engine means and a t interval over engine pairs** (and not a bootstrap, nor the repetitions as pairs):
the repetitions inside one engine share its start-up (memory placement, graph capture, allocator layout), so they
are not independent draws of what a user's engine would do; treating them as such gave Study 06's batch-1 fit
residuals 2-5x its per-point standard errors. The two-stage estimator (average the repetitions within each engine,
then one value per engine pair) is the textbook analysis of a nested design with the engine as a random effect:
with the same points and repetitions in every engine it is exact for the balanced one-way random-effects model
(the mean of engine means has variance ``s_e^2 / R + s_w^2 / (R reps)``, estimated without bias by the sample
variance of the engine means over ``R``; Montgomery, *Design and Analysis of Experiments*, 8th ed., sec. 13.1;
Snijders and Bosker, *Multilevel Analysis*, 2nd ed., sec. 3.3). Student's t with ``R - 1`` degrees of freedom is
valid for the 3-5 engines a device session affords, where a cluster bootstrap is not: with 3 engine pairs it has 10
distinct resamples, its percentile interval lies inside the range of 3 values and under-covers (the reason
:mod:`fp8lab.stats` uses t intervals for few paired trials). The price is honest: with 3 engines the t quantile is
4.30, and the interval says so.

- A point: per round the paired log ratio of the two engines' mean steps; :func:`fp8lab.stats.paired_ratio` over
  rounds (``n`` = engine pairs). Beside it, for contrast, the interval the repetitions would give if they were
  independent (``rep_level_half_width_pct``: what pseudo-replication claims).
- A line per dtype and batch: ``step = a + b x context`` fitted per engine, then a t interval over engines of ``a``
  (fixed cost per step, and per layer: ``a`` / layers) and ``b`` (per token); the fp8 - auto differences per
  engine pair, with t intervals over pairs.
- The crossover ``x* = -da / db`` of the mean paired difference line: Fieller's interval (:func:`fp8lab.stats.
  fieller_root`) with the covariance of the per-pair ``(da, db)`` over pairs, ``R - 1`` degrees of freedom, so the
  engine-to-engine variance of the whole line enters. Reported within the measured contexts only: an end beyond
  them reads "fp8 faster at every measured context" (below) or "not within the measured range" (above), never a
  negative token count.
- The co-location effect: per round, the fp8 - auto fixed-cost difference in the co-located arm minus that in the
  solo arm (the two arms of a round run back to back), a t interval over rounds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fp8lab import stats

#: Columns that identify one measurement of one engine.
ENGINE_KEY = ("arm", "round", "kv_dtype")


def engine_means(m: Any) -> Any:
    """Per engine (``arm``, ``round``, ``kv_dtype``) and point (``batch``, ``context_len``): ``step_ms`` (mean over
    the engine's repetitions), ``reps`` (how many) and ``within_noise_pct`` (:func:`fp8lab.stats.self_noise` of
    its repetitions: what one engine repeats to)."""
    import pandas as pd

    if m is None or len(m) == 0:
        return pd.DataFrame(columns=[*ENGINE_KEY, "batch", "context_len", "step_ms", "reps", "within_noise_pct"])
    keys = [*ENGINE_KEY, "batch", "context_len"]
    g = m.sort_values("rep").groupby(keys, sort=True).step_ms
    out = pd.concat(
        [g.mean().rename("step_ms"), g.size().rename("reps"), g.agg(stats.self_noise).rename("within_noise_pct")],
        axis=1,
    )
    return out.reset_index()


def _pairs(means: Any, base: str, other: str, value: str = "step_ms") -> Any:
    """Rounds where both dtypes have a value: a frame indexed by round with columns ``base`` and ``other``."""
    w = means.pivot_table(index="round", columns="kv_dtype", values=value)
    if base not in w or other not in w:
        return None
    return w[[base, other]].dropna()


def point_table(m: Any, arm: str, base: str = "auto", other: str = "fp8") -> Any:
    """One row per (batch, context_len) of ``arm``: each dtype's mean step over engines (ms), ``ratio`` (other/base,
    the geometric mean over engine pairs) with its 95% t interval over the pairs, ``n`` = ``n_engines`` (pairs),
    ``reps`` (fewest repetitions of an engine there), ``ci_half_width_pct``, ``self_noise_pct`` (engine-to-engine:
    the median change between consecutive engines of one dtype, the larger of the two dtypes), ``within_noise_pct``
    (median within-engine change), ``rep_level_half_width_pct`` (the interval's half-width were the repetitions
    independent pairs) and ``beyond_noise`` (the interval excludes 1 and the change exceeds ``self_noise_pct``)."""
    import pandas as pd

    sub = m[m.arm == arm] if len(m) else m
    means = engine_means(sub)
    rows: list[dict[str, Any]] = []
    for (b, c), g in means.groupby(["batch", "context_len"]):
        w = _pairs(g, base, other)
        if w is None or len(w) < 2:
            continue
        r = stats.paired_ratio(w[base], w[other])
        noise = max(stats.self_noise(w[base]), stats.self_noise(w[other]))
        raw = sub[(sub.batch == b) & (sub.context_len == c)].pivot_table(
            index=["round", "rep"], columns="kv_dtype", values="step_ms"
        )
        raw = raw[[base, other]].dropna()
        rep_level = stats.detectable_pct(stats.paired_ratio(raw[base], raw[other]))
        rows.append(
            {
                "arm": arm,
                "batch": int(b),
                "context_len": int(c),
                f"{base}_step_ms": float(w[base].mean()),
                f"{other}_step_ms": float(w[other].mean()),
                "ratio": r.estimate,
                "ratio_ci_low": r.lo,
                "ratio_ci_high": r.hi,
                "n": r.n,
                "n_engines": r.n,
                "reps": int(g.reps.min()),
                "ci_half_width_pct": stats.detectable_pct(r),
                "rep_level_half_width_pct": rep_level,
                "self_noise_pct": noise,
                "within_noise_pct": float(np.nanmedian(g.within_noise_pct))
                if g.within_noise_pct.notna().any()
                else None,
                "beyond_noise": bool(not r.contains(1.0) and abs(r.estimate - 1) * 100 > noise),
            }
        )
    return pd.DataFrame(rows)


def engine_lines(m: Any) -> Any:
    """Per engine and batch: ``a_ms`` and ``b_ms_per_token`` of ``step = a + b x context`` fitted (least squares) to
    the engine's mean steps, ``n_points`` (contexts; at least 3)."""
    import pandas as pd

    means = engine_means(m)
    rows: list[dict[str, Any]] = []
    for (arm, rnd, d, b), g in means.groupby([*ENGINE_KEY, "batch"]):
        if g.context_len.nunique() < 3:
            continue
        f = stats.ols(g.context_len, g.step_ms)
        rows.append(
            {"arm": arm, "round": int(rnd), "kv_dtype": d, "batch": int(b), "a_ms": f.a, "b_ms_per_token": f.b}
            | {"n_points": f.n}
        )
    return pd.DataFrame(rows)


def _ci(values: Any, scale: float = 1.0) -> dict[str, Any]:
    i = stats.t_interval([float(v) * scale for v in values])
    ok = i.n > 1
    return {"value": i.estimate, "ci_low": i.lo if ok else None, "ci_high": i.hi if ok else None, "n": i.n}


def fit_table(m: Any, layers: int, base: str = "auto", other: str = "fp8") -> Any:
    """Per (arm, batch) and dtype, and for ``other - base`` (``kv_dtype`` = ``"fp8-auto"``): the fixed cost per step
    ``a_ms`` and per layer ``a_us_per_layer`` (``a`` / ``layers``, microseconds), the slope per token
    ``b_ms_per_token`` (and per 1,000 tokens), each the mean over engines (pairs, for the difference) with its 95% t
    interval over them (``*_ci_low`` / ``*_ci_high``), ``n_engines``, ``n_points`` (contexts per engine)."""
    import pandas as pd

    lines = engine_lines(m)
    rows: list[dict[str, Any]] = []
    if lines.empty:
        return pd.DataFrame(rows)
    diff = f"{other}-{base}"

    def row(arm: str, b: int, label: str, a: Any, s: Any, npts: int) -> dict[str, Any]:
        ca, cs = _ci(a), _ci(s)
        cl = _ci(a, 1e3 / layers)
        out: dict[str, Any] = {"arm": arm, "kv_dtype": label, "batch": b}
        for name, c in (("a_ms", ca), ("a_us_per_layer", cl), ("b_ms_per_token", cs)):
            out |= {name: c["value"], f"{name}_ci_low": c["ci_low"], f"{name}_ci_high": c["ci_high"]}
        out |= {"b_ms_per_ktoken": cs["value"] * 1e3, "n_engines": ca["n"], "n_points": npts}
        return out

    for (arm, b), g in lines.groupby(["arm", "batch"]):
        for d, gd in g.groupby("kv_dtype"):
            rows.append(row(arm, int(b), str(d), gd.a_ms, gd.b_ms_per_token, int(gd.n_points.min())))
        pa, pb = _pairs(g, base, other, "a_ms"), _pairs(g, base, other, "b_ms_per_token")
        if pa is not None and len(pa):
            rows.append(row(arm, int(b), diff, pa[other] - pa[base], pb[other] - pb[base], int(g.n_points.min())))
    return pd.DataFrame(rows)


def crossover(da: Any, db: Any, lo_ctx: float, hi_ctx: float, diff_scale: float, ci: float = 0.95) -> dict[str, Any]:
    """Where ``other``'s line meets ``base``'s, from per-pair intercept and slope differences ``da`` (ms) and ``db``
    (ms per token): ``x* = -mean(da) / mean(db)`` and Fieller's interval with the pairs' covariance (``n - 1`` df).

    ``status``: ``none`` (the mean slope difference is not negative: fp8 never catches up as context grows; a slope
    below rounding, ``|db| (hi - lo) <= 1e-9 diff_scale``, counts as zero), ``below_grid`` / ``in_grid`` /
    ``above_grid`` (``x*`` against ``[lo_ctx, hi_ctx]``). The interval is stated within the measured contexts:
    ``ci_low`` None with ``ci_low_below_grid`` where it reaches below ``lo_ctx`` (fp8 faster at every measured
    context is within it), ``ci_high`` None with ``ci_high_above_grid`` past ``hi_ctx``; ``bounded`` False (both
    None) where the slope difference is not resolved. ``interval_text`` says it in words."""
    da_, db_ = np.asarray(da, dtype=float), np.asarray(db, dtype=float)
    n = int(da_.size)
    A, B = float(da_.mean()), float(db_.mean())
    out: dict[str, Any] = {
        "context_len": None,
        "status": "none",
        "ci_low": None,
        "ci_high": None,
        "ci_low_below_grid": False,
        "ci_high_above_grid": False,
        "bounded": False,
        "n_engines": n,
        "diff_at_min_ms": A + B * lo_ctx,
        "diff_at_max_ms": A + B * hi_ctx,
        "diff_slope_ms_per_ktoken": B * 1e3,
    }
    flat = abs(B) * (hi_ctx - lo_ctx) <= 1e-9 * diff_scale
    if B >= 0 or flat:
        out["interval_text"] = (
            "none: fp8 faster at every measured context, its lead not growing with context"
            if out["diff_at_max_ms"] < 0 and out["diff_at_min_ms"] < 0
            else "none: never within the measured range (the fp8 - auto difference does not fall with context)"
        )
        return out
    x = -A / B
    out["status"] = "below_grid" if x < lo_ctx else "above_grid" if x > hi_ctx else "in_grid"
    out["context_len"] = None if x < lo_ctx else x  # below the grid (possibly negative): stated in words, not as tokens
    if n >= 2:
        cov = np.cov(np.vstack([da_, db_]), ddof=1) / n  # covariance of the means over engine pairs
        # the mean difference line a + b x with that covariance; LinearFit.df is n - 2, so n + 1 gives n - 1 df
        line = stats.LinearFit(A, B, float(cov[0, 0]), float(cov[1, 1]), float(cov[0, 1]), n + 1, ci)
        root = stats.fieller_root(line)
        if root.bounded:
            out["bounded"] = True
            out["ci_low_below_grid"] = bool(root.lo < lo_ctx)
            out["ci_high_above_grid"] = bool(root.hi > hi_ctx)
            out["ci_low"] = None if out["ci_low_below_grid"] else float(root.lo)
            out["ci_high"] = None if out["ci_high_above_grid"] else float(root.hi)
    out["interval_text"] = interval_text(out, lo_ctx, hi_ctx)
    if out["status"] == "below_grid":
        out["interval_text"] = (
            f"fp8 faster at every measured context (the lines meet below {lo_ctx:,.0f}); " + (out["interval_text"])
        )
    return out


def interval_text(c: dict[str, Any], lo_ctx: float, hi_ctx: float) -> str:
    """A crossover's 95% interval in words, within the measured contexts (never a negative token count)."""
    if not c["bounded"]:
        return f"unbounded: the slope difference is not resolved over {c['n_engines']} engine pairs"
    low = (
        f"below {lo_ctx:,.0f} (fp8 faster at every measured context)"
        if c["ci_low_below_grid"]
        else f"{c['ci_low']:,.0f}"
    )
    high = (
        f"beyond {hi_ctx:,.0f} (not within the measured range)" if c["ci_high_above_grid"] else f"{c['ci_high']:,.0f}"
    )
    return f"[{low}, {high}] tokens"


def crossover_table(m: Any, arm: str, base: str = "auto", other: str = "fp8") -> Any:
    """Per batch of ``arm``: :func:`crossover` from each engine pair's fitted lines (:func:`engine_lines`), over the
    contexts measured at that batch."""
    import pandas as pd

    sub = m[m.arm == arm] if len(m) else m
    lines = engine_lines(sub)
    rows: list[dict[str, Any]] = []
    for b, g in lines.groupby("batch") if not lines.empty else []:
        pa, pb = _pairs(g, base, other, "a_ms"), _pairs(g, base, other, "b_ms_per_token")
        if pa is None or len(pa) < 1:
            continue
        ctx = sub[sub.batch == b].context_len
        scale = float(sub[sub.batch == b].step_ms.abs().max())
        c = crossover(pa[other] - pa[base], pb[other] - pb[base], float(ctx.min()), float(ctx.max()), scale)
        rows.append({"arm": arm, "batch": int(b), **c, "n_points": int(g.n_points.min())})
    return pd.DataFrame(rows)


def arm_effect(m: Any, layers: int, base: str = "auto", other: str = "fp8") -> Any:
    """Does co-location change the fixed cost? Per batch, for each dtype and for ``other - base``: per round the
    co-located arm's fitted ``a`` minus the solo arm's (ms, and per layer in microseconds), a 95% t interval over the
    rounds that ran both arms (``n_rounds``); ``resolved`` when the interval excludes zero."""
    import pandas as pd

    lines = engine_lines(m)
    rows: list[dict[str, Any]] = []
    if lines.empty or not {"colocated", "solo"} <= set(lines.arm):
        return pd.DataFrame(rows)
    w = lines.pivot_table(index=["batch", "round"], columns=["arm", "kv_dtype"], values="a_ms")
    for b, g in w.groupby(level="batch"):
        for label in (base, other, f"{other}-{base}"):
            try:
                if label == f"{other}-{base}":
                    co = g[("colocated", other)] - g[("colocated", base)]
                    so = g[("solo", other)] - g[("solo", base)]
                else:
                    co, so = g[("colocated", label)], g[("solo", label)]
            except KeyError:
                continue
            d = (co - so).dropna()
            if d.empty:
                continue
            c, cl = _ci(d), _ci(d, 1e3 / layers)
            rows.append(
                {
                    "batch": int(b),
                    "kv_dtype": label,
                    "colocated_a_ms": float(co.mean()),
                    "solo_a_ms": float(so.mean()),
                    "effect_ms": c["value"],
                    "effect_ms_ci_low": c["ci_low"],
                    "effect_ms_ci_high": c["ci_high"],
                    "effect_us_per_layer": cl["value"],
                    "effect_us_per_layer_ci_low": cl["ci_low"],
                    "effect_us_per_layer_ci_high": cl["ci_high"],
                    "n_rounds": c["n"],
                    "resolved": bool(c["ci_low"] is not None and (c["ci_low"] > 0 or c["ci_high"] < 0)),
                }
            )
    return pd.DataFrame(rows)


def finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
