"""How Study 04's latency grows with context length: non-negative polynomial fits of the ramp's medians
(:func:`fit_growth`, :func:`growth_table`), every candidate dtype against ``auto`` per length with a bootstrap
interval on ITL (:func:`speed_table`), and where a candidate becomes faster (:func:`crossover_table`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from fp8lab.longctx.ramp import ramp_table
from fp8lab.longctx.run import LongCtxResult
from fp8lab.longctx.spec import BASELINE


def _nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares ``min |X c - y|`` with ``c >= 0`` for a few columns, exactly: the unconstrained solution
    on every subset of columns (the others held at zero), the best one that is non-negative (the NNLS
    optimum is the unconstrained optimum on its own support; Lawson & Hanson, *Solving Least Squares
    Problems*, 1974, ch. 23)."""
    import itertools

    k = X.shape[1]
    best, best_err = np.zeros(k), float(np.sum(y**2))
    for r in range(1, k + 1):
        for cols in itertools.combinations(range(k), r):
            c, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
            if np.all(c >= 0):
                err = float(np.sum((X[:, cols] @ c - y) ** 2))
                if err < best_err - 1e-15 * max(1.0, best_err):
                    best, best_err = np.zeros(k), err
                    best[list(cols)] = c
    return best


def fit_growth(lengths: Sequence[float], values: Sequence[float], degree: int = 2) -> dict[str, float]:
    """Least squares with non-negative coefficients (:func:`_nnls`, relative errors) of
    ``y = a + b*L (+ c*L^2)``: seconds, seconds per token, seconds per token^2 (``degree`` 1 or 2), with
    ``r2``; and ``exponent``, the log-log slope over the longer half of the lengths (the local growth
    order: 1 for linear, 2 for quadratic). A prefill (TTFT) grows as ``b L`` (weights) plus ``c L^2``
    (attention over the context); a decode step (ITL) as ``a + b L`` (reading L tokens of KV)."""
    x = np.asarray(lengths, dtype=float)
    y = np.asarray(values, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    nan = float("nan")
    out = {"a": nan, "b": nan, "c": nan, "r2": nan, "exponent": nan, "n": int(x.size), "degree": degree}
    if x.size < degree + 1:
        return out
    scale = float(x.max())
    X = np.stack([np.ones_like(x)] + [(x / scale) ** k for k in range(1, degree + 1)], axis=1)
    w = 1.0 / np.maximum(np.abs(y), 1e-12)  # relative error: short lengths count as much as long ones
    coef = _nnls(X * w[:, None], y * w)
    pred = X @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    out.update(
        a=float(coef[0]),
        b=float(coef[1] / scale),
        c=float(coef[2] / scale**2) if degree == 2 else 0.0,
        r2=1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else nan,
    )
    upper = x >= np.median(x)
    if upper.sum() >= 2 and np.all(y[upper] > 0):
        out["exponent"] = float(np.polyfit(np.log(x[upper]), np.log(y[upper]), 1)[0])
    return out


def fitted(fit: Mapping[str, float], lengths: Any) -> np.ndarray:
    """The fitted curve ``a + b L + c L^2`` at ``lengths``."""
    L = np.asarray(lengths, dtype=float)
    return fit["a"] + fit["b"] * L + (fit.get("c") or 0.0) * L**2


#: Metric -> polynomial degree of its growth fit.
GROWTH_METRICS = {"ttft_p50_s": 2, "itl_p50_s": 1, "itl_p95_s": 1, "e2e_p50_s": 2}


def growth_table(ramp: pd.DataFrame, concurrency: int = 1) -> pd.DataFrame:
    """One row per (kv_dtype, metric): :func:`fit_growth` of the ramp's one-at-a-time medians, and the
    fitted value at the longest measured length (``at_longest``)."""
    rows = []
    ok = ramp[(ramp.concurrency == concurrency) & ramp.outcome.isin(["ok", "held"])]
    for dt, g in ok.groupby("kv_dtype", sort=False):
        for m, deg in GROWTH_METRICS.items():
            if m not in g:
                continue
            f = fit_growth(g.length, g[m], deg)
            rows.append(
                {
                    "kv_dtype": dt,
                    "metric": m,
                    **f,
                    "longest": int(g.length.max()),
                    "at_longest": float(fitted(f, g.length.max())) if f["n"] > deg else np.nan,
                }
            )
    return pd.DataFrame(rows)


def measured_crossover(lengths: Sequence[int], base: Sequence[float], cand: Sequence[float]) -> int | None:
    """Smallest length from which ``cand < base`` at every measured length up to the longest (``None``
    when ``cand`` is not below ``base`` at the longest length).

    >>> measured_crossover([1, 2, 4, 8], [1, 1, 1, 1], [2, 0.5, 1.5, 0.9])
    8
    """
    pts = sorted((L, b, c) for L, b, c in zip(lengths, base, cand, strict=True) if np.isfinite(b) and np.isfinite(c))
    found = None
    for L, b, c in reversed(pts):
        if c < b:
            found = L
        else:
            break
    return found


def fitted_crossover(
    fit_base: Mapping[str, float], fit_cand: Mapping[str, float], lo: float, hi: float, points: int = 2048
) -> float | None:
    """Smallest length in ``[lo, hi]`` from which the candidate's fitted curve stays below the baseline's
    (on a log-spaced grid of ``points``); ``None`` when it is not below at ``hi``."""
    if not all(np.isfinite([fit_base.get("a", np.nan), fit_cand.get("a", np.nan)])):
        return None
    L = np.geomspace(lo, hi, points)
    d = fitted(fit_cand, L) - fitted(fit_base, L)
    if d[-1] >= 0:
        return None
    above = np.nonzero(d >= 0)[0]
    return float(L[above[-1] + 1]) if above.size else float(L[0])


def speed_table(res: LongCtxResult, ramp: pd.DataFrame | None = None, n_boot: int = 1000) -> pd.DataFrame:
    """Every candidate dtype against ``auto`` at each (concurrency, length) both ran: ratio of TTFT, ITL
    P50/P95, E2E medians (``< 1``: the candidate is faster), and the ITL median's relative delta with a
    bootstrap CI that resamples requests, each with all its gaps (:func:`fp8lab.stats.bootstrap_delta` with
    ``within=False``: a request's gaps are not independent draws); ``itl_label`` says ``no interval`` when a dtype
    ran fewer than two requests there (one request at a time: the ramp's points), ``within noise`` when the
    interval contains zero."""
    from fp8lab import metrics, stats

    ramp = ramp_table(res) if ramp is None else ramp
    rec = res.records
    rows = []
    base = ramp[ramp.kv_dtype == BASELINE].set_index(["concurrency", "length"])
    for dt in res.plan.kv_dtypes[1:]:
        cand = ramp[ramp.kv_dtype == dt].set_index(["concurrency", "length"])
        for key in base.index.intersection(cand.index):
            b, c = base.loc[key], cand.loc[key]
            if (
                b.outcome == "over_capacity"
                or c.outcome == "over_capacity"
                or pd.isna(b.get("ttft_p50_s"))
                or pd.isna(c.get("ttft_p50_s"))
            ):
                continue
            row = {
                "kv_dtype": dt,
                "concurrency": key[0],
                "length": key[1],
                "outcome_auto": b.outcome,
                "outcome_cand": c.outcome,
            }
            for m in ("ttft_p50_s", "itl_p50_s", "itl_p95_s", "e2e_p50_s"):
                row[m.replace("_s", "_ratio")] = float(c[m] / b[m]) if b[m] else np.nan
            name = f"ramp-c{key[0]}-L{key[1]}"
            keep = ("request",)
            ga = metrics.explode_itl(rec[(rec.role == "ramp") & (rec.kv_dtype == BASELINE) & (rec.phase == name)], keep)
            gb = metrics.explode_itl(rec[(rec.role == "ramp") & (rec.kv_dtype == dt) & (rec.phase == name)], keep)
            d = stats.bootstrap_delta(
                ga.itl_s,
                gb.itl_s,
                "median",
                clusters_a=ga["request"] if "request" in ga else None,
                clusters_b=gb["request"] if "request" in gb else None,
                within=False,
                n_boot=n_boot,
                seed=res.plan.seed,
            )
            row.update(itl_delta=d.delta, itl_lo=d.lo, itl_hi=d.hi, itl_label=d.label.replace("B", dt))
            rows.append(row)
    return pd.DataFrame(rows)


def crossover_table(
    ramp: pd.DataFrame, growth: pd.DataFrame, kv_dtypes: Sequence[str], concurrency: int = 1
) -> pd.DataFrame:
    """Where (if anywhere) each candidate dtype becomes faster than ``auto``, per metric: ``measured``
    (:func:`measured_crossover` on the medians) and ``fitted`` (:func:`fitted_crossover` within the
    measured range); ``ratio_at_longest`` = candidate / auto at the longest length both ran."""
    rows = []
    r = ramp[(ramp.concurrency == concurrency) & (ramp.outcome == "ok")]
    base = r[r.kv_dtype == BASELINE].set_index("length")
    for dt in kv_dtypes[1:]:
        cand = r[r.kv_dtype == dt].set_index("length")
        common = base.index.intersection(cand.index)
        for m in GROWTH_METRICS:
            if not len(common) or m not in base:
                continue
            fb = growth[(growth.kv_dtype == BASELINE) & (growth.metric == m)]
            fc = growth[(growth.kv_dtype == dt) & (growth.metric == m)]
            fx = (
                fitted_crossover(fb.iloc[0], fc.iloc[0], float(common.min()), float(common.max()))
                if len(fb) and len(fc)
                else None
            )
            Lmax = common.max()
            rows.append(
                {
                    "kv_dtype": dt,
                    "concurrency": concurrency,
                    "metric": m,
                    "measured": measured_crossover(list(common), base.loc[common, m], cand.loc[common, m]),
                    "fitted": fx,
                    "ratio_at_longest": float(cand.loc[Lmax, m] / base.loc[Lmax, m]),
                    "longest": int(Lmax),
                }
            )
    return pd.DataFrame(rows)
