"""fp8lab's one statistics module: intervals, A/B deltas, noise floors and fits (numpy/scipy/pandas: no vLLM,
no torch). Every function that returns an interval takes its confidence level as ``ci`` (``0.95`` = a 95%
interval; never an ``alpha``), and every interval records that ``ci``.

Conventions, one per question:

- **An effect of B against A** measured in ``n`` paired repetitions (same prompts, same engine pair,
  interleaved in time) is the geometric mean of the per-pair ratios ``b_i / a_i``, with a Student-t
  interval on the log ratios (``n - 1`` degrees of freedom): valid for small ``n``, unlike a bootstrap of
  three pairs, which can only return their min and max. :func:`paired_ratio`.
- **Noise floor**: the same configuration against itself. :func:`self_noise` is the median absolute
  relative difference between consecutive repetitions of one configuration: a robust statistic, so one
  outlier does not set it (a maximum would).
- **Linear fits** ``y = a + b x`` by ordinary least squares with t intervals on ``a`` and ``b``
  (``n - 2`` degrees of freedom). :func:`ols`.
- **Where two lines cross** (``x* = -da / db`` for the fitted difference of two configurations): a ratio
  of two estimates, so its interval is Fieller's (Fieller, "Some problems in interval estimation",
  JRSS B 16, 1954), which can be one-sided or unbounded when the slope difference is not resolved.
  :func:`fieller_root`.
- **The smallest detectable effect** of a design: the true effect it would detect with 80% power in a two-sided
  5% test, ``(q_{0.975} + q_{0.80}) x SE`` with ``q`` the Student-t quantiles of the design's degrees of freedom
  (paired t: ``n - 1``) or the normal ones for a large-sample or bootstrap interval (Cohen, *Statistical Power
  Analysis*, 1988, ch. 2; the SE is recovered from the recorded interval as half-width / ``q_{0.975}``). The
  interval's half-width alone is the effect detected only half the time (50% power). :func:`detectable_effect`,
  :func:`detectable_from_interval`, :func:`power_detectable_pct` (a ratio's, on the log scale;
  :func:`ratio_half_width_pct` is the half-width).
- **Intervals only over what varies**: a quantity that every repetition reproduces exactly (a deterministic
  replay: Study 07's prefix hit rates) has no sampling interval; :func:`deterministic` says so and
  :func:`interval_text` writes ``deterministic, no interval`` instead of ``+-0.0``.
- **Bootstrap CI of a delta of independent samples** (e.g. every request's TTFT under A and under B): percentile
  bootstrap (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13) of ``stat(B) / stat(A) - 1``.
  With clusters the resampling is two-level (trials with replacement, then requests within each chosen trial), so
  engine-to-engine variation widens the interval (Davison & Hinkley, *Bootstrap Methods*, 1997, sec. 3.8). With
  ``within=False`` whole clusters are resampled and kept intact: **request-level resampling** of latency gaps (a
  request's inter-token gaps are not independent draws; the request is the unit), which gives no interval for
  fewer than two requests a side (label ``"no interval"``). A delta whose interval contains zero is labelled
  ``"within noise"``. :func:`bootstrap_delta`.
- **Bootstrap CI of a statistic of paired items** (the same prompts or windows under both configurations): the
  items are resampled by index, so every paired array indexed with the same indices keeps its pairing.
  :func:`bootstrap_ci`, :func:`bootstrap_mean_ci`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd


def t_quantile(df: int, ci: float = 0.95) -> float:
    """Two-sided Student-t quantile ``t_{(1+ci)/2, df}`` (``inf`` for ``df < 1``)."""
    if df < 1:
        return math.inf
    from scipy import stats

    return float(stats.t.ppf(0.5 + ci / 2.0, df))


@dataclass(frozen=True)
class Interval:
    """An estimate with its ``ci`` interval over ``n`` values (``lo``/``hi`` NaN when ``n < 2``)."""

    estimate: float
    lo: float
    hi: float
    n: int
    ci: float = 0.95

    def contains(self, value: float) -> bool:
        return bool(np.isfinite(self.lo) and np.isfinite(self.hi) and self.lo <= value <= self.hi)

    def half_width(self) -> float:
        return (self.hi - self.lo) / 2.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def t_interval(values: Sequence[float], ci: float = 0.95) -> Interval:
    """Mean of the finite ``values`` with its Student-t interval (``n - 1`` df)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, ci)
    m = float(x.mean())
    if n < 2:
        return Interval(m, math.nan, math.nan, n, ci)
    h = t_quantile(n - 1, ci) * float(x.std(ddof=1)) / math.sqrt(n)
    return Interval(m, m - h, m + h, n, ci)


def welch_interval(x: Sequence[float], y: Sequence[float], ci: float = 0.95) -> Interval:
    """``mean(x) - mean(y)`` of two independent samples with its Welch interval (Welch-Satterthwaite df, floored).

    >>> w = welch_interval([1.0, 2.0, 3.0], [0.0, 1.0, 2.0]); (w.estimate, round(w.lo, 3), round(w.hi, 3), w.n)
    (1.0, -1.267, 3.267, 6)
    """
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    n = int(a.size + b.size)
    if a.size == 0 or b.size == 0:
        return Interval(math.nan, math.nan, math.nan, n, ci)
    d = float(a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return Interval(d, math.nan, math.nan, n, ci)
    va, vb = float(a.var(ddof=1)) / a.size, float(b.var(ddof=1)) / b.size
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Interval(d, d, d, n, ci)
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    h = t_quantile(max(int(df), 1), ci) * se
    return Interval(d, d - h, d + h, n, ci)


def paired_ratio(a: Sequence[float], b: Sequence[float], ci: float = 0.95) -> Interval:
    """Geometric-mean ratio ``b / a`` over paired repetitions, with a t interval on ``log(b_i / a_i)``.

    >>> round(paired_ratio([10, 10], [9, 9]).estimate, 6)
    0.9
    """
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a_.shape != b_.shape:
        raise ValueError(f"paired_ratio: {a_.size} values of A and {b_.size} of B; pairs need equal counts")
    ok = np.isfinite(a_) & np.isfinite(b_) & (a_ > 0) & (b_ > 0)
    li = t_interval(np.log(b_[ok] / a_[ok]), ci)
    return Interval(
        math.exp(li.estimate) if li.n else math.nan,
        math.exp(li.lo) if li.n > 1 else math.nan,
        math.exp(li.hi) if li.n > 1 else math.nan,
        li.n,
        ci,
    )


def self_noise(values: Sequence[float]) -> float:
    """Percent: the median of ``|x_{i+1} / x_i - 1|`` over consecutive repetitions of one configuration
    (NaN for fewer than two finite values)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x) & (x > 0)]
    if x.size < 2:
        return math.nan
    return float(100.0 * np.median(np.abs(x[1:] / x[:-1] - 1.0)))


#: The power and two-sided level of "the smallest detectable effect".
POWER, ALPHA = 0.80, 0.05


def detectable_effect(se: float, df: int | None = None, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true effect a test with standard error ``se`` detects with probability ``power`` at two-sided
    level ``alpha``: ``(q_{1-alpha/2} + q_{power}) x se``, with Student-t quantiles on ``df`` degrees of freedom
    (``None``: normal quantiles; ``inf`` for ``df < 1``).

    >>> round(detectable_effect(1.0), 4)  # 1.9600 + 0.8416
    2.8016
    >>> round(detectable_effect(1.0, df=4), 4)  # paired t over 5 pairs: 2.7764 + 0.9410
    3.7174
    """
    if df is not None and df < 1:
        return math.inf
    from scipy import stats as st

    q = (lambda p: float(st.norm.ppf(p))) if df is None else (lambda p: float(st.t.ppf(p, df)))
    return (q(1 - alpha / 2) + q(power)) * float(se)


def detectable_from_interval(
    lo: float, hi: float, df: int | None = None, ci: float = 0.95, power: float = POWER
) -> float:
    """:func:`detectable_effect` of the design that produced the two-sided ``ci`` interval ``[lo, hi]``: its SE is
    the half-width over ``q_{(1+ci)/2}`` (t on ``df``, or normal for ``None``: a bootstrap or large-sample
    interval). NaN when the interval is not finite.

    >>> round(detectable_from_interval(-1.96, 1.96), 4)  # SE 1
    2.8016
    """
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return math.nan
    if df is not None and df < 1:
        return math.inf
    from scipy import stats as st

    q = float(st.norm.ppf(0.5 + ci / 2)) if df is None else float(st.t.ppf(0.5 + ci / 2, df))
    return detectable_effect((hi - lo) / 2 / q, df, 1 - ci, power)


def ratio_half_width_pct(ratio: Interval) -> float:
    """Percent: the half-width of a ratio's interval (the change detected only half the time: not the smallest
    detectable effect, which is :func:`power_detectable_pct`)."""
    return float(100.0 * ratio.half_width()) if np.isfinite(ratio.lo) else math.nan


#: The former name of :func:`ratio_half_width_pct`, kept because ``fp8lab.decode`` records it as its points'
#: ``ci_half_width_pct``; the smallest detectable effect is :func:`power_detectable_pct`.
detectable_pct = ratio_half_width_pct


def power_detectable_pct(ratio: Interval) -> float:
    """Percent: the smallest relative change the paired design behind ``ratio`` (a t interval of ``n`` pairs on
    the log ratios, :func:`paired_ratio`) detects with 80% power at two-sided 5%: on the log scale
    :func:`detectable_from_interval` with ``n - 1`` degrees of freedom, as ``100 (e^d - 1)``.

    >>> round(power_detectable_pct(Interval(1.0, math.exp(-0.1), math.exp(0.1), 5)), 2)  # SE 0.1 / 2.7764
    14.33
    """
    if not (np.isfinite(ratio.lo) and np.isfinite(ratio.hi)) or ratio.lo <= 0:
        return math.nan
    d = detectable_from_interval(math.log(ratio.lo), math.log(ratio.hi), ratio.n - 1, ratio.ci)
    return float(100.0 * math.expm1(d))


def deterministic(values: Sequence[float], rel_tol: float = 0.0) -> bool:
    """Whether every finite value of a repeated measurement is the same (within ``rel_tol`` of the first): a
    deterministic replay, which has no sampling interval. False for fewer than two values."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 2:
        return False
    return bool(np.all(np.abs(x - x[0]) <= rel_tol * max(abs(float(x[0])), 1e-300)))


def interval_text(lo: float, hi: float, fmt: str = "{:+.1f}", unit: str = "", deterministic_: bool = False) -> str:
    """``[lo, hi]`` with its unit, or ``deterministic, no interval`` for a quantity every repetition reproduced
    (never ``+-0.0``), or ``no interval`` when the ends are unknown."""
    if deterministic_:
        return "deterministic, no interval"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "no interval"
    return f"[{fmt.format(lo)}, {fmt.format(hi)}]{unit}"


@dataclass(frozen=True)
class LinearFit:
    """``y = a + b x`` by least squares over ``n`` points: coefficients, their covariance and t intervals."""

    a: float
    b: float
    var_a: float
    var_b: float
    cov_ab: float
    n: int
    ci: float = 0.95

    @property
    def df(self) -> int:
        return self.n - 2

    def interval(self, which: str) -> tuple[float, float]:
        est, var = (self.a, self.var_a) if which == "a" else (self.b, self.var_b)
        h = t_quantile(self.df, self.ci) * math.sqrt(var) if self.df >= 1 else math.inf
        return est - h, est + h

    def predict(self, x: float) -> float:
        return self.a + self.b * x


def ols(x: Sequence[float], y: Sequence[float], ci: float = 0.95) -> LinearFit:
    """Ordinary least squares of ``y`` on ``x`` with an intercept; at least two distinct ``x``."""
    x_, y_ = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x_) & np.isfinite(y_)
    x_, y_ = x_[ok], y_[ok]
    n = int(x_.size)
    if n < 2 or np.unique(x_).size < 2:
        raise ValueError(f"ols: {n} points with {np.unique(x_).size} distinct x; need two distinct x at least")
    X = np.column_stack([np.ones(n), x_])
    coef, *_ = np.linalg.lstsq(X, y_, rcond=None)
    resid = y_ - X @ coef
    s2 = float(resid @ resid / (n - 2)) if n > 2 else math.nan
    cov = s2 * np.linalg.inv(X.T @ X) if n > 2 else np.full((2, 2), math.nan)
    return LinearFit(float(coef[0]), float(coef[1]), float(cov[0, 0]), float(cov[1, 1]), float(cov[0, 1]), n, ci)


@dataclass(frozen=True)
class Root:
    """Where a fitted line ``a + b x`` crosses zero: ``x = -a / b`` and its Fieller interval.

    ``lo``/``hi`` are ``-inf``/``inf`` where the interval is one-sided, and both NaN where it is the whole
    line or two disjoint rays (the slope is not resolved: no finite statement about the root)."""

    x: float
    lo: float
    hi: float
    bounded: bool


def fieller_root(fit: LinearFit) -> Root:
    """Fieller's interval for ``x* = -a / b``: the ``x`` where ``(a + b x)^2 <= t^2 var(a + b x)``."""
    a, b = fit.a, fit.b
    x = -a / b if b != 0 else math.nan
    t2 = t_quantile(fit.df, fit.ci) ** 2 if fit.df >= 1 else math.inf
    # (b^2 - t2 vb) x^2 + 2 (a b - t2 cab) x + (a^2 - t2 va) <= 0
    qa = b * b - t2 * fit.var_b
    qb = 2.0 * (a * b - t2 * fit.cov_ab)
    qc = a * a - t2 * fit.var_a
    if not all(map(math.isfinite, (qa, qb, qc))):
        return Root(x, math.nan, math.nan, False)
    disc = qb * qb - 4.0 * qa * qc
    if qa > 0 and disc >= 0:  # the slope is resolved: a bounded interval between the roots
        r = math.sqrt(disc)
        lo, hi = sorted(((-qb - r) / (2 * qa), (-qb + r) / (2 * qa)))
        return Root(x, lo, hi, True)
    return Root(x, math.nan, math.nan, False)


# --------------------------------------------------------------------------------------------------
# A/B deltas of paired trials, the noise floor of a configuration against itself, and the verdict rule
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairedDelta:
    """B against A over ``n`` paired trials: ``delta_pct`` = 100 (geometric-mean ratio - 1) with its
    t interval (``lo_pct``, ``hi_pct``; NaN for ``n < 2``) from :func:`paired_ratio`; ``a`` / ``b`` the
    means of the per-trial values."""

    a: float
    b: float
    delta_pct: float
    lo_pct: float
    hi_pct: float
    n: int
    ci: float = 0.95

    @property
    def excludes_zero(self) -> bool:
        return bool(np.isfinite(self.lo_pct) and np.isfinite(self.hi_pct) and (self.lo_pct > 0 or self.hi_pct < 0))

    @property
    def half_width_pct(self) -> float:
        return (self.hi_pct - self.lo_pct) / 2.0 if np.isfinite(self.lo_pct) else math.nan

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "half_width_pct": self.half_width_pct}


def paired_delta(a: Sequence[float], b: Sequence[float], ci: float = 0.95) -> PairedDelta:
    """``b`` vs ``a`` for paired per-trial values (``a[i]`` and ``b[i]`` from trial ``i``): the relative
    delta of the geometric-mean ratio with a Student-t interval on ``log(b_i / a_i)`` (``n - 1`` df).
    Pairs with a missing or non-positive value are dropped together.

    >>> d = paired_delta([100, 100, 100], [110, 110, 110])
    >>> round(d.delta_pct, 6), round(d.lo_pct, 6), d.n
    (10.0, 10.0, 3)
    """
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    r = paired_ratio(a, b, ci)
    ok = np.isfinite(a_) & np.isfinite(b_) & (a_ > 0) & (b_ > 0)
    pct = lambda v: 100.0 * (v - 1.0)  # noqa: E731
    return PairedDelta(
        float(a_[ok].mean()) if ok.any() else math.nan,
        float(b_[ok].mean()) if ok.any() else math.nan,
        pct(r.estimate),
        pct(r.lo),
        pct(r.hi),
        r.n,
        ci,
    )


@dataclass(frozen=True)
class NoiseFloor:
    """A configuration against itself: ``median_pct`` of the absolute relative differences between
    consecutive repetitions of the same configuration (pooled over configurations), their quartiles
    ``q25_pct`` / ``q75_pct`` (the spread of the floor), and ``n_pairs`` differences it rests on."""

    median_pct: float
    q25_pct: float
    q75_pct: float
    n_pairs: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def self_differences(series: Sequence[Sequence[float]]) -> np.ndarray:
    """Percent: ``|x_{i+1} / x_i - 1|`` for consecutive finite positive values of each series (one series per
    configuration, in run order), concatenated."""
    out = []
    for s in series:
        x = np.asarray(s, dtype=float)
        x = x[np.isfinite(x) & (x > 0)]
        if x.size >= 2:
            out.append(100.0 * np.abs(x[1:] / x[:-1] - 1.0))
    return np.concatenate(out) if out else np.empty(0)


def noise_floor(series: Sequence[Sequence[float]]) -> NoiseFloor:
    """The noise floor of :func:`self_differences`: their median with its interquartile range (NaN and
    ``n_pairs`` 0 when no configuration has two values). A median, so one outlying trial does not set it.

    >>> round(noise_floor([[100, 102, 100], [50, 50.5]]).median_pct, 4)  # differences 2, 1.9608, 1
    1.9608
    """
    d = self_differences(series)
    if d.size == 0:
        return NoiseFloor(math.nan, math.nan, math.nan, 0)
    q25, med, q75 = np.percentile(d, [25, 50, 75])
    return NoiseFloor(float(med), float(q25), float(q75), int(d.size))


def beyond_noise(delta: PairedDelta, floor: NoiseFloor) -> bool:
    """The study's rule: a delta is beyond noise only when its interval excludes 0 **and** ``|delta|``
    exceeds the noise floor's median (an unknown floor, fewer than two repetitions, never passes)."""
    return bool(delta.excludes_zero and np.isfinite(floor.median_pct) and abs(delta.delta_pct) > floor.median_pct)


def smallest_detectable_pct(delta: PairedDelta, floor: NoiseFloor) -> float:
    """Percent: the smallest true ``|delta|`` this run would call beyond noise with 80% power: the larger of the
    paired design's detectable effect (:func:`detectable_from_interval` of the interval, ``n - 1`` degrees of
    freedom, on the log scale as the interval was computed) and the noise floor (a smaller delta is not beyond it).
    NaN when either is unknown."""
    nf = floor.median_pct
    if not (np.isfinite(delta.lo_pct) and np.isfinite(delta.hi_pct) and np.isfinite(nf)):
        return math.nan
    lo, hi = 1 + delta.lo_pct / 100, 1 + delta.hi_pct / 100
    if lo <= 0:
        return math.nan
    d = detectable_from_interval(math.log(lo), math.log(hi), delta.n - 1, delta.ci)
    return float(max(100.0 * math.expm1(d), nf))


def delta_label(delta: PairedDelta, higher_is_better: bool) -> str:
    """``"within noise"`` when the interval contains 0 (or is unknown), else ``"better"`` / ``"worse"``
    for B by the metric's direction."""
    if not delta.excludes_zero:
        return "within noise"
    return "better" if (delta.delta_pct > 0) == higher_is_better else "worse"


def delta_sentence(delta: PairedDelta, floor: NoiseFloor) -> str:
    """One line stating n, the interval, the floor and the smallest detectable effect, e.g.
    ``+4.0% [+1.2, +6.9] (n=5 paired trials, 95% t-interval; noise floor 1.1% [IQR 0.6-2.0]; detectable at 80% power
    >= 3.8%)``."""
    ci = f"[{delta.lo_pct:+.1f}, {delta.hi_pct:+.1f}]" if np.isfinite(delta.lo_pct) else "[no interval]"
    nf = (
        f"noise floor {floor.median_pct:.1f}% [IQR {floor.q25_pct:.1f}-{floor.q75_pct:.1f}]"
        if np.isfinite(floor.median_pct)
        else "noise floor unknown"
    )
    sd = smallest_detectable_pct(delta, floor)
    return (
        f"{delta.delta_pct:+.1f}% {ci} (n={delta.n} paired trials, {100 * delta.ci:.0f}% t-interval; {nf}; "
        f"detectable at 80% power >= {sd:.1f}%)"
        if np.isfinite(sd)
        else f"{delta.delta_pct:+.1f}% {ci} (n={delta.n} paired trials; {nf}; no detectable effect stated)"
    )


# --------------------------------------------------------------------------------------------------
# Percentile bootstrap: a delta of two independent samples, and a statistic of paired items
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeltaCI:
    """``stat(B)`` vs ``stat(A)``: ``delta = stat(B) / stat(A) - 1`` (a fraction; ``delta_pct`` in %), its
    bootstrap ``ci`` interval (``lo``, ``hi``, fractions), and ``label`` = ``"within noise"`` when the interval
    contains zero, else ``"B higher"`` / ``"B lower"``."""

    a: float
    b: float
    delta: float
    lo: float
    hi: float
    n_a: int
    n_b: int
    n_boot: int
    ci: float = 0.95
    #: the resampled units (requests, trials) a side, where the resampling is by cluster; None: by value
    units_a: int | None = None
    units_b: int | None = None

    @property
    def within_noise(self) -> bool:
        return bool(not np.isfinite(self.lo) or not np.isfinite(self.hi) or self.lo <= 0.0 <= self.hi)

    @property
    def label(self) -> str:
        if min(self.units_a or 2, self.units_b or 2) < 2:
            return "no interval"
        if self.within_noise:
            return "within noise"
        return "B higher" if self.delta > 0 else "B lower"

    def as_dict(self, pct: bool = True) -> dict[str, Any]:
        d = asdict(self)
        if pct:
            for k in ("delta", "lo", "hi"):
                d[f"{k}_pct"] = 100.0 * d.pop(k)
        d["within_noise"] = self.within_noise
        d["label"] = self.label
        return d


def statistic_fn(statistic: str | Callable[[np.ndarray], float]) -> Callable[[np.ndarray], float]:
    """``"mean"`` | ``"median"`` | ``"pNN"`` (e.g. ``"p99"``) | a callable -> a function of a 1-D array."""
    if callable(statistic):
        return statistic
    if statistic == "mean":
        return lambda x: float(np.mean(x))
    if statistic == "median":
        return lambda x: float(np.median(x))
    if statistic.startswith("p"):
        q = float(statistic[1:])
        return lambda x: float(np.percentile(x, q))
    raise ValueError(f"statistic = {statistic!r}: allowed: mean | median | pNN (e.g. p99) | a callable")


def _groups(values: np.ndarray, clusters: Any) -> list[np.ndarray]:
    if clusters is None:
        return [values]
    cl = np.asarray(clusters)
    if cl.shape[0] != values.shape[0]:
        raise ValueError(f"clusters has {cl.shape[0]} entries for {values.shape[0]} values")
    return [values[cl == c] for c in pd.unique(cl)]


def _resample(groups: list[np.ndarray], rng: np.random.Generator, within: bool = True) -> np.ndarray:
    """One bootstrap replicate: clusters with replacement, then (``within``) values within each chosen cluster
    (one cluster: a plain resample of the values); ``within=False``: the chosen clusters whole."""
    if len(groups) == 1 and within:
        g = groups[0]
        return g[rng.integers(0, g.size, g.size)]
    picks = rng.integers(0, len(groups), len(groups))
    if not within:
        return np.concatenate([groups[i] for i in picks])
    return np.concatenate([groups[i][rng.integers(0, groups[i].size, groups[i].size)] for i in picks])


def bootstrap_delta(
    a: Iterable[float],
    b: Iterable[float],
    statistic: str | Callable = "mean",
    *,
    clusters_a: Sequence[Any] | None = None,
    clusters_b: Sequence[Any] | None = None,
    n_boot: int = 2000,
    ci: float = 0.95,
    seed: int = 0,
    within: bool = True,
) -> DeltaCI:
    """Relative delta ``stat(b) / stat(a) - 1`` with a percentile-bootstrap ``ci`` interval.

    ``a`` and ``b`` are independent samples (e.g. the TTFTs of every request under auto and under
    fp8). ``clusters_a`` / ``clusters_b`` (same length as the values; e.g. the trial of each request)
    make the bootstrap two-level; with ``within=False`` whole clusters are resampled and kept intact
    (request-level resampling of latency gaps: ``clusters`` = the request of each gap), and a side with fewer
    than two clusters gives no interval (NaN ends, label ``"no interval"``). NaN/inf values are dropped
    together with their cluster labels.
    """
    stat = statistic_fn(statistic)

    def prep(v: Iterable[float], cl: Sequence[Any] | None) -> tuple[np.ndarray, np.ndarray | None]:
        arr = np.asarray(list(v) if not isinstance(v, (np.ndarray, pd.Series)) else v, dtype=float)
        keep = np.isfinite(arr)
        return arr[keep], None if cl is None else np.asarray(cl)[keep]

    va, ca = prep(a, clusters_a)
    vb, cb = prep(b, clusters_b)
    nan = float("nan")
    if va.size == 0 or vb.size == 0:
        return DeltaCI(nan, nan, nan, nan, nan, int(va.size), int(vb.size), 0, ci)
    sa, sb = stat(va), stat(vb)
    delta = sb / sa - 1.0 if sa != 0 else nan
    ga, gb = _groups(va, ca), _groups(vb, cb)
    units = (len(ga), len(gb)) if not within and ca is not None and cb is not None else (None, None)
    if not within and min(len(ga), len(gb)) < 2:
        return DeltaCI(float(sa), float(sb), float(delta), nan, nan, int(va.size), int(vb.size), 0, ci, *units)
    rng = np.random.default_rng(seed)
    boots = np.empty(n_boot)
    for i in range(n_boot):
        ra, rb = stat(_resample(ga, rng, within)), stat(_resample(gb, rng, within))
        boots[i] = rb / ra - 1.0 if ra != 0 else nan
    boots = boots[np.isfinite(boots)]
    tail = (1.0 - ci) / 2.0
    lo, hi = np.quantile(boots, [tail, 1.0 - tail]) if boots.size else (nan, nan)
    return DeltaCI(
        float(sa), float(sb), float(delta), float(lo), float(hi), int(va.size), int(vb.size), n_boot, ci, *units
    )


def bootstrap_ci(
    stat: Callable[[np.ndarray], float], n_items: int, n_boot: int = 2000, ci: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap ``(lo, hi)``, a ``ci`` interval, of ``stat(idx)``: a statistic of the items at
    indices ``idx`` (resampled with replacement, seeded); pairing is kept by indexing every paired array with
    ``idx``. ``(nan, nan)`` for no items.

    >>> bootstrap_ci(lambda i: 0.5, 4)  # a statistic every resample gives alike
    (0.5, 0.5)
    """
    if n_items == 0:
        return float("nan"), float("nan")
    # the tail as the decimal it names (0.95 -> exactly 0.025, not 0.025000000000000022): the quantile levels
    # these intervals have always been computed at, so stored results reproduce bit for bit
    tail = round(1.0 - ci, 12) / 2
    rng = np.random.default_rng(seed)
    vals = np.array([stat(rng.integers(0, n_items, size=n_items)) for _ in range(n_boot)], dtype=np.float64)
    return float(np.quantile(vals, tail)), float(np.quantile(vals, 1 - tail))


def bootstrap_mean_ci(
    values: Iterable[float], n_boot: int = 2000, ci: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap ``(lo, hi)``, a ``ci`` interval, of the mean of the finite ``values``."""
    a = np.asarray(list(values), dtype=np.float64)
    a = a[np.isfinite(a)]
    return bootstrap_ci(lambda i: float(a[i].mean()), a.size, n_boot, ci, seed)


__all__ = [
    "DeltaCI",
    "Interval",
    "LinearFit",
    "NoiseFloor",
    "PairedDelta",
    "Root",
    "beyond_noise",
    "bootstrap_ci",
    "bootstrap_delta",
    "bootstrap_mean_ci",
    "delta_label",
    "delta_sentence",
    "detectable_effect",
    "detectable_from_interval",
    "detectable_pct",
    "deterministic",
    "power_detectable_pct",
    "ratio_half_width_pct",
    "interval_text",
    "fieller_root",
    "noise_floor",
    "ols",
    "paired_delta",
    "paired_ratio",
    "self_differences",
    "self_noise",
    "smallest_detectable_pct",
    "statistic_fn",
    "t_interval",
    "t_quantile",
]
