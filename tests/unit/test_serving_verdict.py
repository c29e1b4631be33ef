"""Study 01's verdict lines that are computed from tables alone: the fidelity check's summary (with each
tool's own run-to-run spread) and the preemption line, on numbers measured on the H200 (the committed
records of reports/h200/shipped, and the fidelity rows printed by reports/h200's Study 01 HTML)."""

from __future__ import annotations

import tarfile

import pandas as pd
import pytest

from fp8lab import serving
from fp8lab.engine import results
from fp8lab.paths import REPO_ROOT

SHIPPED = REPO_ROOT / "reports" / "h200" / "shipped" / "records" / "01_kv_dtype_auto_vs_fp8.tar.gz"


def _rows(values):
    """Fidelity rows in run order (bench, fp8lab, fp8lab, bench, ...), tokens/s as given."""
    out = []
    for r, (first, second) in enumerate(zip(values[::2], values[1::2], strict=True)):
        order = ("bench", "fp8lab") if r % 2 == 0 else ("fp8lab", "bench")
        out += [
            {"round": r, "who": order[0], "status": "ok", "tokens_per_second": first},
            {"round": r, "who": order[1], "status": "ok", "tokens_per_second": second},
        ]
    return pd.DataFrame(out)


def test_fidelity_summary_on_the_h200_rows():
    # reports/h200, Study 01 (8B-shaped, eager, 1024 in + 256 out, 256 requests): two rounds
    f = serving.fidelity_summary(_rows([21745.61, 20290.77, 21177.84, 20672.20]))
    assert f["round_ratios"] == pytest.approx([20290.77 / 21745.61, 21177.84 / 20672.20])
    assert f["ratio"] == pytest.approx(0.97878, abs=1e-5) and f["within_tolerance"]
    assert f["spread_pct"] == pytest.approx({"bench": 5.1925, "fp8lab": 4.3718}, abs=1e-3)
    assert f["resolvable"] is False  # each tool varied by more than 3% against itself
    line = serving.fidelity_line(f)
    assert (
        "= 0.979 (median of 2 rounds; within 3%; run to run, vLLM bench varied by 5.19%, fp8lab varied by 4.37%)"
    ) in line
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


def test_fidelity_line_of_a_check_cut_short():
    # reports/h200 Study 01 (CUDA graphs, 1024 in + 256 out, 512 requests, fp8): round 1's vLLM bench run was
    # cut by the session's device time; re-rendered from the store it is "not in the fidelity store"
    rows = _rows([29289.826420561472, 29196.863880061563, 29204.70658873174, 0.0])
    rows.loc[3, ["status", "tokens_per_second"]] = ["error", None]
    f = serving.fidelity_summary(rows, tolerance=0.02)
    assert f["round_ratios"] == pytest.approx([29196.863880061563 / 29289.826420561472])  # 0.99683
    assert f["spread_pct"] == pytest.approx({"fp8lab": 0.026861}, abs=1e-5) and f["resolvable"] is None
    line = serving.fidelity_line({**f, "rows": rows})
    assert "= 0.997 (one round; within 2%; run to run, fp8lab varied by 0.03%)." in line
    assert "Not measured: round 1 vLLM bench (error)." in line
    assert "is not established" in line


def test_fidelity_check_runs_nothing_when_store_only(tmp_path, monkeypatch):
    """Re-rendering from committed stores (FP8LAB_STORE_ONLY): a run missing from the fidelity store is an
    error row, never a vLLM start; stored runs are loaded."""
    from fp8lab.specs import EngineSpec, spec_hash

    monkeypatch.setenv(results.STORE_ONLY_ENV, "1")
    spec = EngineSpec(
        model=str(REPO_ROOT / "data" / "configs" / "qwen3-8b"),
        load_format="dummy",
        skip_tokenizer_init=True,
        kv_cache_gib=24,
        kv_cache_dtype="fp8",
    )
    settings = {  # the key holds the model as given and its config's digest, never this checkout's path
        "engine": {**spec.to_dict(), "model": "data/configs/qwen3-8b"},
        "model_digest": results.model_digest(spec.model, "dummy"),
        "input_len": 8,
        "output_len": 4,
        "num_prompts": 2,
        "num_warmups": 4,
        "tokenizer": None,
        "prompt_source": "random",
        "temperature": 1.0,
    }
    keep = tmp_path / spec_hash(settings)
    keep.mkdir()
    (keep / "round0-bench.json").write_text('{"round": 0, "who": "bench", "status": "ok", "tokens_per_second": 100.0}')
    out = serving.fidelity_check(spec, 8, 4, 2, rounds=1, store=tmp_path, progress=False)
    rows = out["rows"].set_index("who")
    assert rows.loc["bench", "cached"] and rows.loc["bench", "tokens_per_second"] == 100.0
    assert rows.loc["fp8lab", "status"] == "error" and "FP8LAB_STORE_ONLY" in rows.loc["fp8lab", "error"]
    assert out["ratio"] is None


def test_preemption_line_on_the_shipped_model_records(tmp_path):
    with tarfile.open(SHIPPED) as t:
        t.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    ph = results.phase_table("01_kv_dtype_auto_vs_fp8", tmp_path)
    closed = ph[ph.phase.str.match(r"^closed-c\d+$")].copy()
    tp = pd.DataFrame(
        {
            "kv_dtype": closed.kv_cache_dtype,
            "trial": closed.tag.str.removeprefix("trial").astype(int),
            "concurrency": closed.phase.str.removeprefix("closed-c").astype(int),
            "preemptions": closed.preemptions,
        }
    )
    assert len(tp) == 12  # the paired run of 2026-12-02: 2 dtypes x 3 trials x 2 concurrencies
    line = serving.preemption_line(tp, "auto", "fp8")
    # sustained 30 s phases at c=128: both ran out of KV, fp8 about half as often
    assert line.startswith(
        "- **Preemptions (closed loop).** `auto` preempted at c=128 (155, 170, 173 over 3 "
        "trials); `fp8` preempted at c=128 (71, 79, 87 over 3 trials)"
    )
    assert "Only" not in line
    only_auto = tp.assign(preemptions=tp.preemptions.where(tp.kv_dtype == "auto", 0))
    assert "Only `auto` ran out of KV cache" in serving.preemption_line(only_auto, "auto", "fp8")
    assert serving.preemption_line(tp.assign(preemptions=0), "auto", "fp8") is None


def test_throughput_points_name_the_method():
    assert serving.tput_point("output tok/s @c=32") == "c=32"
    assert serving.tput_point("output tok/s (no stream) @c=32") == "c=32 (no stream)"


# ------------------------------------------------------------------------------------------------------------------
# The paired design's deltas (issue 15, part 2): per-trial values, paired t-intervals, the noise floor, the rule
# ------------------------------------------------------------------------------------------------------------------


def test_latency_percentiles_are_taken_per_trial_not_pooled():
    import numpy as np

    values = np.array([1.0, 2.0, 3.0, 10.0, 20.0, 30.0, 4.0])
    trials = np.array([0, 0, 0, 1, 1, 1, 1])
    assert serving.per_trial(values, trials, "p50") == {0: 2.0, 1: 15.0}  # pooled, the median would be 4.0
    assert serving.per_trial(values, trials, "p99") == pytest.approx({0: 2.98, 1: 29.7})


def test_delta_row_on_five_paired_trials():
    import math

    # throughput of 5 trials; B = A x exp(x) with x = 0.03, 0.05, 0.04, 0.06, 0.02 (mean 0.04, sd 0.0158114)
    a = {0: 1000.0, 1: 990.0, 2: 1010.0, 3: 1005.0, 4: 995.0}
    x = [0.03, 0.05, 0.04, 0.06, 0.02]
    b = {t: a[t] * math.exp(x[t]) for t in a}
    r = serving.delta_row("output tok/s @c=8", a, b, higher_is_better=True)
    hw = 2.776445 * math.sqrt(0.001 / 4) / math.sqrt(5)
    assert r["n"] == 5 and r["delta_pct"] == pytest.approx(100 * (math.exp(0.04) - 1))
    assert (r["lo_pct"], r["hi_pct"]) == pytest.approx(
        (100 * (math.exp(0.04 - hw) - 1), 100 * (math.exp(0.04 + hw) - 1)), abs=1e-4
    )
    # floor: consecutive differences of A (1.0101, 2.0202, 0.4950, 0.9950 %) and of B, pooled, their median
    ab = [abs(a[t + 1] / a[t] - 1) * 100 for t in range(4)] + [abs(b[t + 1] / b[t] - 1) * 100 for t in range(4)]
    ab.sort()
    assert r["noise_pairs"] == 8 and r["noise_floor_pct"] == pytest.approx((ab[3] + ab[4]) / 2)
    assert r["label"] == "better" and r["beyond_noise_floor"] is True
    # the smallest effect 5 paired trials detect with 80% power (t quantiles of 4 df), or the floor if larger
    half_log = (math.log(1 + r["hi_pct"] / 100) - math.log(1 + r["lo_pct"] / 100)) / 2
    mde = 100 * (math.exp((2.776445 + 0.940965) * half_log / 2.776445) - 1)
    assert r["detectable_pct"] == pytest.approx(max(r["noise_floor_pct"], mde), rel=1e-5)
    # the same numbers as a latency (lower is better): worse, still beyond noise
    assert serving.delta_row("TTFT P99 @c=8", a, b, higher_is_better=False)["label"] == "worse"
    # a trial only one dtype has is not paired: n counts the common trials
    r4 = serving.delta_row("m", {**a, 5: 1.0}, b, True)
    assert r4["n"] == 5 and r4["n_a"] == 6
    line = serving.delta_line(pd.Series(r))
    assert (
        "n=5 paired trials, 95% t-interval" in line
        and "detectable at 80% power >=" in line
        and line.endswith("better, beyond noise")
    )


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
    names = {
        d: {
            0: ["warmup", "closed-c2", "closed-c24", "open-constant-4"],
            1: ["closed-c2", "closed-c24", "open-constant-4"],
            2: ["closed-c2", "closed-c24", "open-constant-4"],
        }
        for d in ("auto", "fp8")
    }
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


def _run(d, trial, **facts):
    from fp8lab.engine.result import EngineResult

    return {
        "kv_dtype": d,
        "trial": trial,
        "result": EngineResult(
            status="ok", error=None, engine=dict(facts), records=None, samples=None, phases={}, provenance={}
        ),
    }


def test_memory_of_engines_sharing_one_gpu_is_each_engines_own():
    # reports/h200 Study 01 (paired, both engines on one H200; NVML reads the whole device): auto started first
    # (device 0.645 -> 48.218 GB), fp8 second (48.218 -> 96.429 GB); the device's peak with both was 96.433 GB
    a = dict(
        mem_kind="gpu",
        mem_baseline_bytes=644939776,
        mem_after_start_bytes=48217587712,
        mem_peak_bytes=96432750592,
        mem_steady_bytes=96432750592.0,
    )
    f = dict(
        mem_kind="gpu",
        mem_baseline_bytes=48217587712,
        mem_after_start_bytes=96428556288,
        mem_peak_bytes=96432750592,
        mem_steady_bytes=96430653440.0,
    )
    runs = [_run("auto", 0, **a), _run("fp8", 0, **f), _run("auto", 1, **a), _run("fp8", 1, **f)]
    serving.attribute_shared_memory(runs)
    ea, ef = runs[0]["result"].engine, runs[1]["result"].engine
    grew = 96432750592 - 96428556288  # after both started: counted to each engine (an upper bound)
    assert ea["mem_peak_bytes"] == 48217587712 - 644939776 + grew  # 44.31 GiB, not the device's 89.81
    assert ef["mem_peak_bytes"] == 96428556288 - 48217587712 + grew
    assert ef["mem_steady_bytes"] == 96428556288 - 48217587712 + (96430653440 - 96428556288)
    assert ea["mem_device_peak_bytes"] == 96432750592 and ea["mem_shared_device"] is True
    serving.attribute_shared_memory(runs)  # applied once: a second call changes nothing
    assert runs[0]["result"].engine["mem_peak_bytes"] == 48217587712 - 644939776 + grew
    # engines measured alone (one dtype) or by their own resident memory (CPU) keep their figures
    alone = [_run("auto", 0, **a), _run("auto", 1, **a)]
    serving.attribute_shared_memory(alone)
    assert alone[0]["result"].engine["mem_peak_bytes"] == 96432750592
    cpu = [_run("auto", 0, **{**a, "mem_kind": "cpu_rss"}), _run("fp8", 0, **{**f, "mem_kind": "cpu_rss"})]
    serving.attribute_shared_memory(cpu)
    assert (
        cpu[1]["result"].engine["mem_peak_bytes"] == 96432750592 and "mem_shared_device" not in cpu[1]["result"].engine
    )
