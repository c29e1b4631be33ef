"""fp8lab.stats on data small enough to work by hand. Every expected number is derived in the comments (or by an
independent route in the test: scipy.stats, a brute-force scan), never by calling the function under test."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as sps

from fp8lab import stats

# Student-t 0.975 quantiles from the printed tables (df = 2, 4)
T2, T4 = 4.302652729749462, 2.7764451051977934


def test_t_quantile_matches_the_table():
    assert stats.t_quantile(2) == pytest.approx(T2, abs=1e-9)
    assert stats.t_quantile(4) == pytest.approx(T4, abs=1e-9)
    assert stats.t_quantile(0) == math.inf


def test_t_interval_n3():
    # mean 2, sd (ddof 1) = sqrt(((-1)^2 + 0 + 1^2) / 2) = 1, half-width = t(2) * 1 / sqrt(3)
    i = stats.t_interval([1.0, 2.0, 3.0])
    h = T2 / math.sqrt(3)  # 2.48414
    assert (i.estimate, i.n) == (2.0, 3)
    assert (i.lo, i.hi) == pytest.approx((2 - h, 2 + h), rel=1e-12)
    assert i.half_width() == pytest.approx(2.484138, abs=1e-6)
    assert (i.lo, i.hi) == pytest.approx(sps.t.interval(0.95, 2, loc=2, scale=sps.sem([1, 2, 3])))


def test_t_interval_n5_drops_non_finite_values():
    # mean 3, sd = sqrt((4 + 1 + 0 + 1 + 4) / 4) = sqrt(2.5), half-width = t(4) * sqrt(2.5 / 5) = 1.963243
    i = stats.t_interval([1.0, 2.0, math.nan, 3.0, 4.0, 5.0, math.inf])
    assert (i.estimate, i.n) == (3.0, 5)
    assert i.half_width() == pytest.approx(T4 * math.sqrt(0.5), rel=1e-12)
    assert i.half_width() == pytest.approx(1.963243, abs=1e-6)
    assert i.contains(1.04) and not i.contains(1.03) and i.contains(4.96) and not i.contains(4.97)


def test_t_interval_too_few_values_has_no_interval():
    one, none = stats.t_interval([7.0]), stats.t_interval([])
    assert one.estimate == 7.0 and one.n == 1 and math.isnan(one.lo) and math.isnan(one.hi)
    assert none.n == 0 and math.isnan(none.estimate)
    assert not one.contains(7.0)  # no interval: contains nothing, not everything


def test_paired_ratio_is_a_t_interval_on_log_ratios():
    # ratios e^-0.1, e^-0.2, e^0: logs mean -0.1, sd 0.1 -> log half-width t(2) * 0.1 / sqrt(3) = 0.2484138
    a = [10.0, 20.0, 5.0]
    b = [10 * math.exp(-0.1), 20 * math.exp(-0.2), 5.0]
    r = stats.paired_ratio(a, b)
    h = T2 * 0.1 / math.sqrt(3)
    assert r.n == 3
    assert r.estimate == pytest.approx(math.exp(-0.1), rel=1e-12)  # the geometric mean, not the mean ratio
    assert (r.lo, r.hi) == pytest.approx((math.exp(-0.1 - h), math.exp(-0.1 + h)), rel=1e-12)
    assert stats.detectable_pct(r) == pytest.approx(50 * (math.exp(-0.1 + h) - math.exp(-0.1 - h)), rel=1e-12)
    # the smallest detectable effect of 3 pairs at 80% power: (t(0.975, 2) + t(0.8, 2)) x SE on the log scale,
    # SE = 0.1 / sqrt(3); t(0.8, 2) = (2p - 1) / sqrt(2p (1 - p)) = 0.6 / sqrt(0.32) = 1.060660 (2 df's closed form)
    se = 0.1 / math.sqrt(3)
    assert stats.power_detectable_pct(r) == pytest.approx(100 * (math.exp((T2 + 1.060660) * se) - 1), rel=1e-5)
    assert stats.power_detectable_pct(r) > stats.ratio_half_width_pct(r)  # the half-width has only 50% power


def test_detectable_effect_at_80_percent_power():
    # normal: z(0.975) + z(0.80) = 1.959964 + 0.841621 = 2.801585 standard errors
    assert stats.detectable_effect(1.0) == pytest.approx(2.801585, abs=1e-6)
    assert stats.detectable_effect(0.5) == pytest.approx(1.400792, abs=1e-6)
    # paired t over 5 pairs (4 df): t(0.975, 4) + t(0.80, 4) = 2.776445 + 0.940965
    assert stats.detectable_effect(1.0, df=4) == pytest.approx(3.717410, abs=1e-6)
    assert stats.detectable_effect(1.0, df=0) == math.inf
    # from a recorded 95% interval: SE = half-width / quantile, so a t interval of half-width 2.776445 on 4 df
    # has SE 1 and a bootstrap (normal) interval of half-width 1.96 has SE 1
    assert stats.detectable_from_interval(-2.776445, 2.776445, df=4) == pytest.approx(3.717410, abs=1e-5)
    assert stats.detectable_from_interval(1.0 - 1.959964, 1.0 + 1.959964) == pytest.approx(2.801585, abs=1e-5)
    assert math.isnan(stats.detectable_from_interval(math.nan, 1.0))


def test_deterministic_replays_have_no_interval():
    assert stats.deterministic([0.51, 0.51, 0.51]) and not stats.deterministic([0.51, 0.52, 0.51])
    assert not stats.deterministic([0.5])  # one value: nothing repeated
    assert stats.interval_text(0.0, 0.0, deterministic_=True) == "deterministic, no interval"
    assert stats.interval_text(-1.25, 2.5, unit=" pp") == "[-1.2, +2.5] pp"
    assert stats.interval_text(math.nan, 1.0) == "no interval"


def test_request_level_resampling_keeps_a_requests_gaps_together():
    # two requests a side, each with constant gaps: resampling whole requests can only give the medians of the
    # four request combinations, so every replicate's median is one of a few values; resampling gaps as if
    # independent would give the same here, so the check is on the units and on one request giving no interval
    a, ca = [1.0] * 10 + [3.0] * 10, [0] * 10 + [1] * 10
    b, cb = [1.0] * 10 + [3.0] * 10, [0] * 10 + [1] * 10
    d = stats.bootstrap_delta(a, b, "mean", clusters_a=ca, clusters_b=cb, within=False, n_boot=400)
    assert (d.units_a, d.units_b) == (2, 2) and d.delta == 0.0
    # replicate means are 1, 2 or 3 per side: the ratio is one of 1/3, 1/2, 2/3, 1, 3/2, 2, 3 minus 1
    assert d.lo >= 1 / 3 - 1 and d.hi <= 2 and d.label == "within noise"
    one = stats.bootstrap_delta(
        [1.0, 1.1, 0.9], [2.0, 2.1, 1.9], "median", clusters_a=[0] * 3, clusters_b=[0] * 3, within=False
    )
    assert one.label == "no interval" and math.isnan(one.lo) and one.delta == pytest.approx(1.0)
    # by value (the former way), the gaps of one request give a spuriously narrow interval
    by_gap = stats.bootstrap_delta([1.0, 1.1, 0.9], [2.0, 2.1, 1.9], "median")
    assert by_gap.label == "B higher"


def test_paired_ratio_pairs_are_kept_together():
    # a pair with a non-positive or missing value is dropped as a pair: the rest stay paired
    r = stats.paired_ratio([1.0, 0.0, 2.0, math.nan], [2.0, 5.0, 4.0, 3.0])
    assert r.n == 2 and r.estimate == pytest.approx(2.0) and r.lo == pytest.approx(2.0) and r.hi == pytest.approx(2.0)
    with pytest.raises(ValueError, match="3 values of A and 2 of B"):
        stats.paired_ratio([1, 2, 3], [1, 2])


def test_self_noise_is_the_median_consecutive_change():
    # changes 10%, 0%, 10%, 0%: the median of four is the mean of the middle two, 5% (not the upper one, 10%)
    assert stats.self_noise([100.0, 110.0, 110.0, 121.0, 121.0]) == pytest.approx(5.0)
    # changes 0, 0, 0, 100%: one outlier does not set the floor (a maximum would say 100%)
    assert stats.self_noise([100.0, 100.0, 100.0, 100.0, 200.0]) == 0.0
    # changes 1%, 2%, 50%: median 2%
    assert stats.self_noise([100.0, 101.0, 103.02, 154.53]) == pytest.approx(2.0)
    assert math.isnan(stats.self_noise([5.0])) and math.isnan(stats.self_noise([5.0, math.nan, -1.0]))


# x = 0, 1, 2, 3; y = 1, 3, 2, 4. By hand: xbar 1.5, ybar 2.5, Sxx 5, Sxy = 2.25 - 0.25 - 0.25 + 2.25 = 4
# b = 4/5 = 0.8, a = 2.5 - 0.8 * 1.5 = 1.3; residuals -0.3, 0.9, -0.9, 0.3: SSE 1.8, s^2 = 1.8 / 2 = 0.9
# var b = s^2 / Sxx = 0.18; var a = s^2 (1/n + xbar^2 / Sxx) = 0.9 * 0.7 = 0.63; cov = -xbar s^2 / Sxx = -0.27
X4, Y4 = [0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 2.0, 4.0]


def test_ols_by_hand():
    f = stats.ols(X4, Y4)
    assert (f.a, f.b, f.n, f.df) == pytest.approx((1.3, 0.8, 4, 2))
    assert (f.var_a, f.var_b, f.cov_ab) == pytest.approx((0.63, 0.18, -0.27))
    assert f.interval("b") == pytest.approx((0.8 - T2 * math.sqrt(0.18), 0.8 + T2 * math.sqrt(0.18)))
    assert f.interval("a") == pytest.approx((1.3 - T2 * math.sqrt(0.63), 1.3 + T2 * math.sqrt(0.63)))
    assert f.predict(10.0) == pytest.approx(9.3)


def test_ols_agrees_with_scipy_linregress():
    rng = np.random.default_rng(6)
    x = np.array([1024, 2048, 4096, 6144, 8192, 12288, 16384], dtype=float)
    y = 7.0 + 4.37e-5 * x + rng.normal(0, 0.01, x.size)
    ref = sps.linregress(x, y)
    f = stats.ols(list(x) + [math.nan], list(y) + [1.0])  # a point with a missing x is left out
    assert f.n == 7
    assert (f.a, f.b) == pytest.approx((ref.intercept, ref.slope), rel=1e-9)
    assert (math.sqrt(f.var_a), math.sqrt(f.var_b)) == pytest.approx((ref.intercept_stderr, ref.stderr), rel=1e-9)
    t5 = sps.t.ppf(0.975, 5)
    assert f.interval("b") == pytest.approx((ref.slope - t5 * ref.stderr, ref.slope + t5 * ref.stderr), rel=1e-9)


def test_ols_needs_two_distinct_x():
    with pytest.raises(ValueError, match="1 distinct x"):
        stats.ols([5.0, 5.0, 5.0], [1.0, 2.0, 3.0])
    two = stats.ols([0.0, 1.0], [1.0, 3.0])  # a line through two points: exact, but no interval (0 df)
    assert (two.a, two.b) == pytest.approx((1.0, 2.0)) and two.interval("b") == (-math.inf, math.inf)


def _band_roots(x, y, guess_lo, guess_hi):
    """Fieller's interval by another route: the x where the 95% confidence band of the fitted mean line
    (yhat(x) +- t s sqrt(1/n + (x - xbar)^2 / Sxx)) touches zero, found by root search from both sides."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    slope, icpt = np.polyfit(x, y, 1)
    n, xbar = x.size, x.mean()
    sxx = ((x - xbar) ** 2).sum()
    s = math.sqrt(((y - (icpt + slope * x)) ** 2).sum() / (n - 2))
    t = sps.t.ppf(0.975, n - 2)

    def g(x0):
        return abs(icpt + slope * x0) - t * s * math.sqrt(1 / n + (x0 - xbar) ** 2 / sxx)

    root = -icpt / slope
    return root, optimize.brentq(g, guess_lo, root), optimize.brentq(g, root, guess_hi)


def test_fieller_bounded_when_the_slope_is_resolved():
    # y falls by ~1 per unit of x and crosses zero near x = 4; small residuals: the slope is resolved
    x = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    y = [4.05, 2.95, 2.02, 0.97, 0.03, -1.04, -1.98]
    f = stats.ols(x, y)
    r = stats.fieller_root(f)
    root, lo, hi = _band_roots(x, y, -100.0, 100.0)
    assert r.bounded and r.x == pytest.approx(root, rel=1e-9)
    assert (r.lo, r.hi) == pytest.approx((lo, hi), rel=1e-7)
    assert r.lo < r.x < r.hi and hi - lo < 0.2  # a tight interval around 4.0
    # Fieller's interval is not symmetric about the root: it is not x* +- t se (the delta method)


def test_fieller_interval_far_from_the_data_is_wide_and_asymmetric():
    # a shallow line crossing zero well past the data (x = 0..4, root near 20): an extrapolated root
    x = [0.0, 1.0, 2.0, 3.0, 4.0]
    y = [2.0, 1.92, 1.79, 1.71, 1.6]
    r = stats.fieller_root(stats.ols(x, y))
    root, lo, hi = _band_roots(x, y, 4.0, 1e4)
    assert r.bounded and r.x == pytest.approx(root) and r.x > 4
    assert (r.lo, r.hi) == pytest.approx((lo, hi), rel=1e-7)
    assert r.hi - r.x > r.x - r.lo  # longer on the far side


def test_fieller_unbounded_when_the_slope_is_not_resolved():
    # the hand fit above: b = 0.8 with 95% interval 0.8 +- 4.3027 * 0.4243 = [-1.03, 2.63], which holds 0;
    # the quadratic's leading term b^2 - t^2 var b = 0.64 - 18.513 * 0.18 = -2.69 < 0: no bounded interval
    r = stats.fieller_root(stats.ols(X4, Y4))
    assert r.x == pytest.approx(-1.3 / 0.8) and not r.bounded and math.isnan(r.lo) and math.isnan(r.hi)
    # two points: no degrees of freedom, no interval
    r2 = stats.fieller_root(stats.ols([0.0, 1.0], [1.0, -1.0]))
    assert r2.x == pytest.approx(0.5) and not r2.bounded


# ------------------------------------------------------------------------------------------- bootstrap
def test_bootstrap_delta_excludes_zero_for_a_clear_shift():
    rng = np.random.default_rng(1)
    a = 10 + rng.normal(0, 0.1, 200)
    b = 12 + rng.normal(0, 0.1, 200)
    ci = stats.bootstrap_delta(a, b, "mean", n_boot=500)
    assert ci.delta == pytest.approx(b.mean() / a.mean() - 1)
    assert 0.19 < ci.lo < ci.delta < ci.hi < 0.21
    assert not ci.within_noise and ci.label == "B higher"
    d = ci.as_dict()
    assert d["delta_pct"] == pytest.approx(100 * ci.delta) and d["label"] == "B higher"


def test_bootstrap_delta_contains_zero_for_the_same_sample():
    a = np.arange(1.0, 21.0)
    b = a[::-1].copy()  # the same values: the delta is exactly 0
    ci = stats.bootstrap_delta(a, b, "p50", n_boot=500)
    assert ci.delta == 0.0 and ci.lo < 0 < ci.hi
    assert ci.within_noise and ci.label == "within noise"


def test_cluster_bootstrap_is_wider_when_clusters_differ():
    # three trials whose levels differ a lot: resampling trials must widen the interval
    a = np.concatenate([np.full(50, 10.0), np.full(50, 12.0), np.full(50, 14.0)]) + np.linspace(0, 0.1, 150)
    cl = np.repeat([0, 1, 2], 50)
    b = a * 1.05
    plain = stats.bootstrap_delta(a, b, "mean", n_boot=400)
    clustered = stats.bootstrap_delta(a, b, "mean", clusters_a=cl, clusters_b=cl, n_boot=400)
    assert (clustered.hi - clustered.lo) > 3 * (plain.hi - plain.lo)
    assert clustered.delta == pytest.approx(0.05)


def test_bootstrap_mean_ci_brackets_the_mean():
    lo, hi = stats.bootstrap_mean_ci([0.0, 1.0] * 20, seed=0)
    assert lo < 0.5 < hi
    assert stats.bootstrap_mean_ci([1.0, 1.0, 1.0]) == (1.0, 1.0)
    assert all(math.isnan(v) for v in stats.bootstrap_mean_ci([float("nan")]))


def test_bootstrap_ci_quantile_levels_are_the_decimal_tails():
    # the replicates by the documented recipe (seeded generator, n indices with replacement per replicate); a 95%
    # interval is their 2.5% and 97.5% quantiles at exactly 0.025 / 0.975, so stored results reproduce bit for bit
    x = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])
    rng = np.random.default_rng(5)
    reps = np.array([x[rng.integers(0, x.size, size=x.size)].mean() for _ in range(300)])
    for ci, tail in ((0.95, 0.025), (0.9, 0.05), (0.99, 0.005)):
        got = stats.bootstrap_ci(lambda i: float(x[i].mean()), x.size, n_boot=300, ci=ci, seed=5)
        assert got == (float(np.quantile(reps, tail)), float(np.quantile(reps, 1 - tail)))
    wide, narrow = (stats.bootstrap_mean_ci(x, n_boot=300, ci=c, seed=5) for c in (0.99, 0.5))
    assert wide[0] < narrow[0] < narrow[1] < wide[1]


def test_bootstrap_delta_ci_is_the_confidence_level():
    rng = np.random.default_rng(3)
    a, b = 10 + rng.normal(0, 1, 80), 11 + rng.normal(0, 1, 80)
    d95, d50 = (stats.bootstrap_delta(a, b, "mean", n_boot=400, ci=c) for c in (0.95, 0.5))
    assert d95.ci == 0.95 and d50.ci == 0.5 and d95.delta == d50.delta
    assert d95.lo < d50.lo < d50.hi < d95.hi
