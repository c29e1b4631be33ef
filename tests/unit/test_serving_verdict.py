"""Study 01's verdict lines that are computed from tables alone: the fidelity check's summary (with each
tool's own run-to-run spread) and the preemption line, on numbers measured on the H200 (the committed
records of reports/h200/shipped, and the fidelity rows printed by reports/h200's Study 01 HTML)."""

from __future__ import annotations

import tarfile

import pandas as pd
import pytest

from fp8lab import results, serving
from fp8lab.paths import REPO_ROOT

SHIPPED = REPO_ROOT / "reports" / "h200" / "shipped" / "records" / "01_kv_dtype_auto_vs_fp8.tar.gz"


def _rows(values):
    """Fidelity rows in run order (bench, fp8lab, fp8lab, bench, ...), tokens/s as given."""
    out = []
    for r, (first, second) in enumerate(zip(values[::2], values[1::2], strict=True)):
        order = ("bench", "fp8lab") if r % 2 == 0 else ("fp8lab", "bench")
        out += [{"round": r, "who": order[0], "status": "ok", "tokens_per_second": first},
                {"round": r, "who": order[1], "status": "ok", "tokens_per_second": second}]
    return pd.DataFrame(out)


def test_fidelity_summary_on_the_h200_rows():
    # reports/h200, Study 01 (8B-shaped, eager, 1024 in + 256 out, 256 requests): two rounds
    f = serving.fidelity_summary(_rows([21745.61, 20290.77, 21177.84, 20672.20]))
    assert f["round_ratios"] == pytest.approx([20290.77 / 21745.61, 21177.84 / 20672.20])
    assert f["ratio"] == pytest.approx(0.97878, abs=1e-5) and f["within_tolerance"]
    assert f["spread_pct"] == pytest.approx({"bench": 5.1925, "fp8lab": 4.3718}, abs=1e-3)
    assert f["resolvable"] is False  # each tool varied by more than 3% against itself
    line = serving.fidelity_line(f)
    assert "= 0.979 (within 3%; run to run, vLLM bench varied by 5.2%, fp8lab varied by 4.4%)" in line
    assert "within that variation" in line
    # reports/h200/shipped (the tiny model, CUDA graphs, 256 requests): 0.784, but fp8lab varied by 23.7%
    g = serving.fidelity_summary(_rows([195074.93, 127739.80, 158063.45, 172947.14]))
    assert g["ratio"] == pytest.approx(0.78438, abs=1e-5) and not g["within_tolerance"] and g["resolvable"] is False
    assert "outside 3%" in serving.fidelity_line(g) and "no verdict on either tool" in serving.fidelity_line(g)


def test_fidelity_summary_when_it_can_tell():
    steady = serving.fidelity_summary(_rows([100.0, 101.0, 100.5, 100.2]))
    assert steady["resolvable"] is True and steady["within_tolerance"]
    assert "cannot resolve" not in serving.fidelity_line(steady)
    off = serving.fidelity_summary(_rows([100.0, 90.0, 91.0, 101.0]))  # steady tools, 10% apart
    assert off["resolvable"] is True and not off["within_tolerance"] and off["ratio"] == pytest.approx(0.9005, abs=1e-4)
    wide = serving.fidelity_summary(_rows([100.0, 80.0, 84.0, 104.0]))  # 20% apart, tools vary by 4-5%
    assert wide["resolvable"] is False and "the tools disagree" in serving.fidelity_line(wide)
    one = serving.fidelity_summary(_rows([100.0, 97.0]))
    assert one["resolvable"] is None and one["spread_pct"] == {} and one["ratio"] == pytest.approx(0.97)
    failed = _rows([100.0, 97.0, 99.0, 100.0])
    failed.loc[3, ["status", "tokens_per_second"]] = ["failed", None]
    f = serving.fidelity_summary(failed)
    assert f["round_ratios"] == pytest.approx([0.97]) and f["resolvable"] is None  # bench ran once
    assert serving.fidelity_line(None) is None


def test_preemption_line_on_the_shipped_model_records(tmp_path):
    with tarfile.open(SHIPPED) as t:
        t.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    ph = results.phase_table("01_kv_dtype_auto_vs_fp8", tmp_path)
    closed = ph[ph.phase.str.match(r"^closed-c\d+$")].copy()
    tp = pd.DataFrame({"kv_dtype": closed.kv_cache_dtype, "trial": closed.tag.str.removeprefix("trial").astype(int),
                       "concurrency": closed.phase.str.removeprefix("closed-c").astype(int),
                       "preemptions": closed.preemptions})
    assert len(tp) == 24  # 2 dtypes x 3 trials x 4 concurrencies
    line = serving.preemption_line(tp, "auto", "fp8")
    assert line.startswith("- **Preemptions (closed loop).** `auto` preempted at c=128 (15, 15, 15 over 3 trials); "
                           "`fp8` never preempted.")
    assert "Only `auto` ran out of KV cache" in line
    both = tp.assign(preemptions=1)
    assert "Only" not in serving.preemption_line(both, "auto", "fp8")
    assert serving.preemption_line(tp.assign(preemptions=0), "auto", "fp8") is None


def test_throughput_points_name_the_method():
    assert serving._tput_point("output tok/s @c=32") == "c=32"
    assert serving._tput_point("output tok/s (no stream) @c=32") == "c=32 (no stream)"


# ------------------------------------------------------------------------------------------------------------------
# The paired design's deltas (issue 15, part 2): per-trial values, paired t-intervals, the noise floor, the rule
# ------------------------------------------------------------------------------------------------------------------


def test_latency_percentiles_are_taken_per_trial_not_pooled():
    import numpy as np

    values = np.array([1.0, 2.0, 3.0, 10.0, 20.0, 30.0, 4.0])
    trials = np.array([0, 0, 0, 1, 1, 1, 1])
    assert serving._per_trial(values, trials, "p50") == {0: 2.0, 1: 15.0}  # pooled, the median would be 4.0
    assert serving._per_trial(values, trials, "p99") == pytest.approx({0: 2.98, 1: 29.7})


def test_delta_row_on_five_paired_trials():
    import math

    # throughput of 5 trials; B = A x exp(x) with x = 0.03, 0.05, 0.04, 0.06, 0.02 (mean 0.04, sd 0.0158114)
    a = {0: 1000.0, 1: 990.0, 2: 1010.0, 3: 1005.0, 4: 995.0}
    x = [0.03, 0.05, 0.04, 0.06, 0.02]
    b = {t: a[t] * math.exp(x[t]) for t in a}
    r = serving.delta_row("output tok/s @c=8", a, b, higher_is_better=True)
    hw = 2.776445 * math.sqrt(0.001 / 4) / math.sqrt(5)
    assert r["n"] == 5 and r["delta_pct"] == pytest.approx(100 * (math.exp(0.04) - 1))
    assert (r["lo_pct"], r["hi_pct"]) == pytest.approx((100 * (math.exp(0.04 - hw) - 1), 100 * (math.exp(0.04 + hw) - 1)),
                                                       abs=1e-4)
    # floor: consecutive differences of A (1.0101, 2.0202, 0.4950, 0.9950 %) and of B, pooled, their median
    ab = [abs(a[t + 1] / a[t] - 1) * 100 for t in range(4)] + [abs(b[t + 1] / b[t] - 1) * 100 for t in range(4)]
    ab.sort()
    assert r["noise_pairs"] == 8 and r["noise_floor_pct"] == pytest.approx((ab[3] + ab[4]) / 2)
    assert r["label"] == "better" and r["beyond_noise_floor"] is True
    assert r["detectable_pct"] == pytest.approx(max(r["noise_floor_pct"], (r["hi_pct"] - r["lo_pct"]) / 2))
    # the same numbers as a latency (lower is better): worse, still beyond noise
    assert serving.delta_row("TTFT P99 @c=8", a, b, higher_is_better=False)["label"] == "worse"
    # a trial only one dtype has is not paired: n counts the common trials
    r4 = serving.delta_row("m", {**a, 5: 1.0}, b, True)
    assert r4["n"] == 5 and r4["n_a"] == 6
    line = serving.delta_line(pd.Series(r))
    assert "n=5 paired trials, 95% t-interval" in line and "detectable >=" in line and line.endswith("better, beyond noise")


def test_delta_row_not_beyond_a_floor_it_does_not_exceed():
    # every trial of B is 2% above A (a zero-width interval clear of 0), but each config moves 5% trial to trial
    a = {0: 100.0, 1: 105.0, 2: 100.0, 3: 105.0, 4: 100.0}
    b = {t: v * 1.02 for t, v in a.items()}
    r = serving.delta_row("output tok/s @c=64", a, b, higher_is_better=True)
    assert r["label"] == "better" and r["lo_pct"] == pytest.approx(2.0) and r["hi_pct"] == pytest.approx(2.0)
    assert r["noise_floor_pct"] == pytest.approx((5.0 + 100 * (1 - 100 / 105)) / 2)  # median of 5, 4.76, 5, 4.76, ...
    assert r["beyond_noise_floor"] is False and r["detectable_pct"] == pytest.approx(r["noise_floor_pct"])
    assert serving.delta_line(pd.Series(r)).endswith("better, but not beyond the noise floor")


def test_paired_schedule_alternates_by_phase_and_trial():
    names = {d: {0: ["warmup", "closed-c2", "closed-c24", "open-constant-4"], 1: ["closed-c2", "closed-c24", "open-constant-4"],
                 2: ["closed-c2", "closed-c24", "open-constant-4"]} for d in ("auto", "fp8")}
    names["auto"][0] = names["auto"][0] + ["cap-c31"]
    names["fp8"][0] = names["fp8"][0] + ["cap-c63"]
    s = serving.paired_schedule(names, ["auto", "fp8"], 3)
    assert len(s) == 2 * (4 + 3 + 3) + 2
    assert s[:4] == [(0, "warmup", "auto"), (0, "warmup", "fp8"), (0, "closed-c2", "auto"), (0, "closed-c2", "fp8")]
    assert [x for x in s if x[1].startswith("cap")] == [(0, "cap-c31", "auto"), (0, "cap-c63", "fp8")]
    # within a trial the two runs of a phase are adjacent, and which dtype goes first alternates
    firsts = {}
    for i in range(0, len(s) - 1):
        if s[i][:2] == s[i + 1][:2]:
            firsts[s[i][:2]] = s[i][2]
    assert [firsts[(t, "closed-c2")] for t in range(3)] == ["auto", "fp8", "auto"]
    assert [firsts[(t, "closed-c24")] for t in range(3)] == ["fp8", "auto", "fp8"]
    assert [firsts[(t, "open-constant-4")] for t in range(3)] == ["auto", "fp8", "auto"]
    measured = [v for k, v in firsts.items() if k[1] != "warmup"]
    assert sorted((sum(v == "auto" for v in measured), sum(v == "fp8" for v in measured))) == [4, 5]
