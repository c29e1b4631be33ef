"""fp8lab.stats' A/B functions for Study 01 on hand-computed data: the paired t-interval on log ratios, the noise
floor (median of consecutive self-differences, with its IQR), the "beyond noise" rule and the smallest detectable
effect. Expected values are worked out here from the formulas (t quantiles from a printed table), not by the code
under test."""

from __future__ import annotations

import math

import pytest

from fp8lab import stats

T975 = {2: 4.302653, 4: 2.776445}  # Student t, 97.5% quantile (printed tables)


def _pct(x: float) -> float:
    return 100.0 * (math.exp(x) - 1.0)


def test_paired_delta_n3_interval_contains_zero():
    # log ratios 0.00, 0.02, 0.04: mean 0.02, sd 0.02, se 0.02 / sqrt(3); t(2) = 4.302653
    a = [200.0, 150.0, 100.0]
    b = [a[0], a[1] * math.exp(0.02), a[2] * math.exp(0.04)]
    d = stats.paired_delta(a, b)
    hw = T975[2] * 0.02 / math.sqrt(3)
    assert d.n == 3
    assert d.delta_pct == pytest.approx(_pct(0.02), abs=1e-9)  # 2.0201%
    assert d.lo_pct == pytest.approx(_pct(0.02 - hw), abs=1e-4)  # -2.925%
    assert d.hi_pct == pytest.approx(_pct(0.02 + hw), abs=1e-4)  # +7.217%
    assert d.lo_pct == pytest.approx(-2.9247, abs=1e-3) and d.hi_pct == pytest.approx(7.2168, abs=1e-3)
    assert not d.excludes_zero
    assert d.a == pytest.approx(150.0) and d.b == pytest.approx(sum(b) / 3)
    # a min-max "interval" of the three ratios would be [0, +4.08]%: the t-interval is wider, as it must be for n=3
    assert d.lo_pct < 0 < 4.08 < d.hi_pct


def test_paired_delta_n5_excludes_zero():
    x = [0.03, 0.05, 0.04, 0.06, 0.02]  # mean 0.04, sd sqrt(0.001 / 4) = 0.0158114
    a = [1000.0, 990.0, 1010.0, 1005.0, 995.0]
    b = [ai * math.exp(xi) for ai, xi in zip(a, x, strict=True)]
    d = stats.paired_delta(a, b)
    hw = T975[4] * math.sqrt(0.001 / 4) / math.sqrt(5)  # 0.019632
    assert d.n == 5 and d.excludes_zero
    assert d.delta_pct == pytest.approx(_pct(0.04), abs=1e-9)  # 4.0811%
    assert (d.lo_pct, d.hi_pct) == pytest.approx((_pct(0.04 - hw), _pct(0.04 + hw)), abs=1e-4)
    assert (d.lo_pct, d.hi_pct) == pytest.approx((2.0577, 6.1446), abs=1e-3)
    assert d.half_width_pct == pytest.approx((6.1446 - 2.0577) / 2, abs=1e-3)


def test_paired_delta_drops_incomplete_pairs_and_handles_one_pair():
    d = stats.paired_delta([100.0, float("nan"), 100.0, 0.0], [110.0, 120.0, 110.0, 5.0])
    assert d.n == 2 and d.delta_pct == pytest.approx(10.0)
    assert d.lo_pct == pytest.approx(10.0) and d.hi_pct == pytest.approx(10.0)  # no spread: a zero-width interval
    one = stats.paired_delta([100.0], [90.0])
    assert one.n == 1 and one.delta_pct == pytest.approx(-10.0)
    assert math.isnan(one.lo_pct) and not one.excludes_zero
    with pytest.raises(ValueError, match="pairs need equal counts"):
        stats.paired_delta([1.0, 2.0], [1.0])


def test_noise_floor_is_the_median_of_consecutive_self_differences():
    a = [100.0, 103.0, 100.0, 102.0, 101.0]  # 3, 2.9126, 2, 0.9804 (%)
    b = [200.0, 202.0, 198.0, 200.0, 204.0]  # 1, 1.9802, 1.0101, 2 (%)
    diffs = sorted(stats.self_differences([a, b]))
    expect = sorted([3.0, 300 / 103, 2.0, 100 / 102, 1.0, 400 / 202, 200 / 198, 2.0])
    assert diffs == pytest.approx(expect)
    nf = stats.noise_floor([a, b])
    assert nf.n_pairs == 8
    assert nf.median_pct == pytest.approx((400 / 202 + 2.0) / 2)  # 1.9901: between the 4th and 5th of 8
    # numpy's linear quantiles: q25 at position 1.75, q75 at 5.25 of the sorted eight
    assert nf.q25_pct == pytest.approx(1.0 + 0.75 * (200 / 198 - 1.0))
    assert nf.q75_pct == pytest.approx(2.0 + 0.25 * (300 / 103 - 2.0))
    assert nf.median_pct < 3.0  # the largest difference (the old floor) would be 3.0


def test_noise_floor_resists_one_outlying_trial():
    steady = [100.0, 101.0, 100.0, 101.0, 100.0]  # 1, 0.990, 1, 0.990 (%)
    spiked = [100.0, 101.0, 150.0, 101.0, 100.0]  # 1, 48.5, 32.7, 0.990 (%)
    assert stats.noise_floor([steady]).median_pct == pytest.approx((1.0 + 100 / 101) / 2)
    nf = stats.noise_floor([steady, spiked])  # 8 differences, two of them huge
    assert nf.median_pct == pytest.approx(1.0)  # the 4th and 5th of 0.99, 0.99, 0.99, 1, 1, 1, 32.7, 48.5
    assert nf.q75_pct < 10.0 < max(stats.self_differences([spiked]))
    empty = stats.noise_floor([[5.0], []])
    assert empty.n_pairs == 0 and math.isnan(empty.median_pct)


def test_beyond_noise_needs_the_interval_and_the_floor():
    d = stats.PairedDelta(1000.0, 1040.8, 4.08, 2.06, 6.14, 5)
    assert stats.beyond_noise(d, stats.NoiseFloor(1.99, 1.01, 2.23, 8))
    assert not stats.beyond_noise(d, stats.NoiseFloor(5.0, 3.0, 7.0, 8))  # interval clear of 0, delta under the floor
    assert not stats.beyond_noise(d, stats.NoiseFloor(math.nan, math.nan, math.nan, 0))  # floor unknown
    wide = stats.PairedDelta(1000.0, 1100.0, 10.0, -1.0, 21.0, 3)  # large but the interval holds 0
    assert not stats.beyond_noise(wide, stats.NoiseFloor(1.0, 0.5, 2.0, 4))
    neg = stats.PairedDelta(1000.0, 960.0, -4.0, -6.0, -2.0, 5)  # |delta| counts, either sign
    assert stats.beyond_noise(neg, stats.NoiseFloor(3.9, 1.0, 5.0, 8))
    assert not stats.beyond_noise(neg, stats.NoiseFloor(4.1, 1.0, 5.0, 8))


def test_labels_and_the_smallest_detectable_effect():
    d = stats.PairedDelta(1000.0, 1040.8, 4.08, 2.06, 6.14, 5)
    assert stats.delta_label(d, higher_is_better=True) == "better"
    assert stats.delta_label(d, higher_is_better=False) == "worse"  # e.g. a latency that grew
    assert stats.delta_label(stats.PairedDelta(1, 1, 2.0, -1.0, 5.0, 3), True) == "within noise"
    # the paired design's detectable effect at 80% power, two-sided 5%, 4 degrees of freedom, on the log scale:
    # SE = half-width / t(0.975, 4) = ((ln 1.0614 - ln 1.0206) / 2) / 2.776445; effect (2.776445 + 0.940965) x SE
    se = (math.log(1.0614) - math.log(1.0206)) / 2 / 2.776445
    mde = 100 * (math.exp((2.776445 + 0.940965) * se) - 1)  # 2.659%, not the half-width 2.04%
    assert mde == pytest.approx(2.659, abs=1e-3)
    assert stats.smallest_detectable_pct(d, stats.NoiseFloor(1.99, 1.0, 2.2, 8)) == pytest.approx(mde, rel=1e-5)
    assert stats.smallest_detectable_pct(d, stats.NoiseFloor(3.0, 1.0, 4.0, 8)) == pytest.approx(3.0)  # the floor
    line = stats.delta_sentence(d, stats.NoiseFloor(1.99, 1.01, 2.23, 8))
    assert line == (
        "+4.1% [+2.1, +6.1] (n=5 paired trials, 95% t-interval; noise floor 2.0% [IQR 1.0-2.2]; "
        "detectable at 80% power >= 2.7%)"
    )
