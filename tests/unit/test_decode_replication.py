"""Study 06's engine-level replication (issue 35): the ABBA schedule (fp8lab.engine.schedule) and the statistics with
the engine as the unit (fp8lab.decode.replication) on rows constructed here, where each engine's offset and each
repetition's noise are chosen by hand, so every interval can be computed beside the code."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from fp8lab import kvmath
from fp8lab.decode import replication as rp
from fp8lab.engine.schedule import abba_schedule, start_order

T2 = sps.t.ppf(0.975, 2)  # 3 engine pairs: 2 degrees of freedom (4.303)


# ------------------------------------------------------------------------------------------------ the schedule
def test_solo_engines_start_abba_and_colocated_pairs_alternate():
    s = abba_schedule(["auto", "fp8"], 3)
    assert start_order(s, "solo") == ["auto", "fp8", "fp8", "auto", "auto", "fp8"]
    assert [x.configs for x in s if x.arm == "colocated"] == [("auto", "fp8"), ("fp8", "auto"), ("auto", "fp8")]
    # rounds interleave the arms (colocated first, then solo first, ...): a round's two arms run back to back
    assert [x.key for x in s] == [
        "colocated/r0",
        "solo/r0/auto",
        "solo/r0/fp8",
        "solo/r1/fp8",
        "solo/r1/auto",
        "colocated/r1",
        "colocated/r2",
        "solo/r2/auto",
        "solo/r2/fp8",
    ]
    assert {x.engine_id(c) for x in s for c in x.configs} == {
        f"{a}/r{r}/{d}" for a in ("colocated", "solo") for r in range(3) for d in ("auto", "fp8")
    }
    # one engine per dtype, not co-located (models too large for two): one set per engine, still ABBA
    assert [x.key for x in abba_schedule(["a", "b"], 2, ["colocated"], colocate=False)] == [
        "colocated/r0/a",
        "colocated/r0/b",
        "colocated/r1/b",
        "colocated/r1/a",
    ]


@pytest.mark.parametrize(
    "configs, rounds, arms",
    [(["a", "a"], 3, ["solo"]), (["a"], 0, ["solo"]), (["a"], 1, ["nearby"]), ([], 1, ["solo"])],
)
def test_schedule_refuses_what_it_cannot_order(configs, rounds, arms):
    with pytest.raises(ValueError):
        abba_schedule(configs, rounds, arms)


# ------------------------------------------------------------------------------------------------ constructed rows
def _rows(lines, reps=3, noise=0.0, ctx=(4096, 8192, 12288, 16384), arm="solo", batch=1):
    """Rows of engines whose step is exactly ``a + b x ctx`` (ms), times ``1 + noise x (-1, 0, +1, ...)`` over the
    repetitions: ``lines`` maps (round, dtype) to (a, b)."""
    out = []
    pattern = [-1.0, 0.0, 1.0, 0.5, -0.5]
    for (rnd, d), (a, b) in lines.items():
        for c in ctx:
            for rep in range(reps):
                out.append(
                    {
                        "arm": arm,
                        "round": rnd,
                        "kv_dtype": d,
                        "engine": f"{arm}/r{rnd}/{d}",
                        "batch": batch,
                        "context_len": c,
                        "rep": rep,
                        "step_ms": (a + b * c) * (1 + noise * pattern[rep % 5]),
                    }
                )
    return pd.DataFrame(out)


def test_point_interval_is_over_engines_and_widens_where_engines_dominate():
    """Engines differ by a few percent, repetitions by 0.01%: the interval is the t interval of the three pairs' log
    ratios (hand-computed), tens of times wider than the one the repetitions would claim, and it holds the true
    ratio 1 that the repetition-level interval excludes."""
    offs = {
        (0, "auto"): 1.00,
        (0, "fp8"): 1.04,
        (1, "auto"): 1.02,
        (1, "fp8"): 0.99,
        (2, "auto"): 0.98,
        (2, "fp8"): 1.00,
    }
    lines = {k: (5.0 * o, 0.0) for k, o in offs.items()}
    m = _rows(lines, noise=1e-4, ctx=(4096,))
    p = rp.point_table(m, "solo").iloc[0]
    logs = np.log([1.04 / 1.00, 0.99 / 1.02, 1.00 / 0.98])
    h = T2 * logs.std(ddof=1) / math.sqrt(3)
    assert p.ratio == pytest.approx(math.exp(logs.mean()), rel=1e-6)
    assert p.ratio_ci_low == pytest.approx(math.exp(logs.mean() - h), rel=1e-4)
    assert p.ratio_ci_high == pytest.approx(math.exp(logs.mean() + h), rel=1e-4)
    assert p.n == p.n_engines == 3 and p.reps == 3
    assert p.ratio_ci_low < 1 < p.ratio_ci_high and not p.beyond_noise
    # the repetitions as pairs: 9 pairs, each within 0.01% of its engine pair's ratio -> about a 3% half-width...
    r9 = np.repeat(logs, 3)
    assert p.rep_level_half_width_pct < p.ci_half_width_pct / 1.5
    assert p.rep_level_half_width_pct == pytest.approx(
        100 * math.sinh(sps.t.ppf(0.975, 8) * r9.std(ddof=1) / 3) * math.exp(r9.mean()), rel=0.05
    )
    # ...and with engines that agree, the engine-level interval is as narrow as the repetitions make it
    same = {k: (5.0 * (1.03 if k[1] == "fp8" else 1.0), 0.0) for k in offs}
    q = rp.point_table(_rows(same, noise=1e-4, ctx=(4096,)), "solo").iloc[0]
    assert q.ci_half_width_pct < 0.05 and q.ratio == pytest.approx(1.03, rel=1e-6) and q.beyond_noise
    assert p.ci_half_width_pct > 50 * q.ci_half_width_pct


def test_fits_recover_each_engine_line_and_interval_over_engines():
    a = {(0, "auto"): 5.00, (1, "auto"): 5.06, (2, "auto"): 4.97, (0, "fp8"): 5.05, (1, "fp8"): 5.09, (2, "fp8"): 5.04}
    b = {(0, "auto"): 4e-5, (1, "auto"): 4.1e-5, (2, "auto"): 3.9e-5, (0, "fp8"): 2e-5, (1, "fp8"): 2.2e-5}
    b[(2, "fp8")] = 2.1e-5
    m = _rows({k: (a[k], b[k]) for k in a}, noise=0.0)
    f = rp.fit_table(m, layers=36).set_index("kv_dtype")
    for d in ("auto", "fp8"):
        av = np.array([a[(r, d)] for r in range(3)])
        h = T2 * av.std(ddof=1) / math.sqrt(3)
        assert f.loc[d, "a_ms"] == pytest.approx(av.mean())
        assert f.loc[d, "a_ms_ci_low"] == pytest.approx(av.mean() - h)
        assert f.loc[d, "a_us_per_layer"] == pytest.approx(av.mean() * 1e3 / 36)
        assert f.loc[d, "a_us_per_layer_ci_high"] == pytest.approx((av.mean() + h) * 1e3 / 36)
        assert f.loc[d, "b_ms_per_token"] == pytest.approx(np.mean([b[(r, d)] for r in range(3)]))
        assert f.loc[d, "n_engines"] == 3 and f.loc[d, "n_points"] == 4
    da = np.array([a[(r, "fp8")] - a[(r, "auto")] for r in range(3)])
    h = T2 * da.std(ddof=1) / math.sqrt(3)
    assert f.loc["fp8-auto", "a_ms"] == pytest.approx(da.mean())
    assert (f.loc["fp8-auto", "a_ms_ci_low"], f.loc["fp8-auto", "a_ms_ci_high"]) == pytest.approx(
        (da.mean() - h, da.mean() + h)
    )


def _fieller(da, db, t):
    A, B = np.mean(da), np.mean(db)
    cov = np.cov(np.vstack([da, db]), ddof=1) / len(da)
    qa, qb, qc = B * B - t * t * cov[1, 1], 2 * (A * B - t * t * cov[0, 1]), A * A - t * t * cov[0, 0]
    r = math.sqrt(qb * qb - 4 * qa * qc)
    return sorted(((-qb - r) / (2 * qa), (-qb + r) / (2 * qa)))


def test_crossover_interval_carries_engine_variance():
    da = np.array([0.050, 0.070, 0.060])  # fp8's extra fixed cost per engine pair, ms
    db = np.array([-8.0e-6, -7.6e-6, -8.4e-6])  # its smaller slope, ms per token
    c = rp.crossover(da, db, 4096, 20480, 10.0)
    assert c["status"] == "in_grid" and c["context_len"] == pytest.approx(-da.mean() / db.mean())
    lo, hi = _fieller(da, db, T2)
    assert (c["ci_low"], c["ci_high"]) == pytest.approx((lo, hi)) and c["bounded"]
    assert c["interval_text"] == f"[{lo:,.0f}, {hi:,.0f}] tokens"
    # more engine-to-engine spread in the fixed cost, same means: a wider interval
    wide = rp.crossover(da.mean() + 3 * (da - da.mean()), db, 4096, 20480, 10.0)
    assert wide["context_len"] == pytest.approx(c["context_len"])
    lo2, hi2 = _fieller(da.mean() + 3 * (da - da.mean()), db, T2)
    assert (wide["ci_low"] or 4096) <= lo and hi2 > hi and lo2 < lo
    # an interval reaching below the smallest measured context is stated in words, never as a token count
    low = rp.crossover(np.array([0.002, 0.030, -0.020]), db, 4096, 20480, 10.0)
    assert low["ci_low"] is None and low["ci_low_below_grid"]
    assert "below 4,096 (fp8 faster at every measured context)" in low["interval_text"]


def test_crossover_none_below_and_unresolved():
    db = np.array([-8.0e-6, -7.6e-6, -8.4e-6])
    below = rp.crossover(np.array([-0.03, -0.02, -0.04]), db, 4096, 20480, 10.0)  # fp8 already faster at 0 tokens
    assert below["status"] == "below_grid" and below["context_len"] is None
    assert below["interval_text"].startswith("fp8 faster at every measured context")
    none = rp.crossover(np.array([0.05, 0.06, 0.07]), -db, 4096, 20480, 10.0)
    assert (
        none["status"] == "none"
        and none["context_len"] is None
        and "never within the measured range" in (none["interval_text"])
    )
    lead = rp.crossover(np.array([-0.05, -0.06, -0.07]), -db / 100, 4096, 20480, 10.0)
    assert lead["status"] == "none" and lead["interval_text"].startswith("none: fp8 faster at every measured")
    flat = rp.crossover(np.array([0.05, 0.06, 0.07]), np.array([-9e-6, 8e-6, 1e-7]), 4096, 20480, 10.0)
    assert flat["status"] == "in_grid" or flat["status"] == "above_grid"
    assert not flat["bounded"] and flat["ci_low"] is None and flat["interval_text"].startswith("unbounded")


def test_crossover_table_from_constructed_engines():
    lines = {}
    for r, (ea, eb) in enumerate([(0.0, 0.0), (0.02, 2e-7), (-0.01, -3e-7)]):
        lines[(r, "auto")] = (5.0 + ea, 4e-5 + eb)
        lines[(r, "fp8")] = (5.06 + ea + 0.01 * r, 3.2e-5 + eb)
    t = rp.crossover_table(_rows(lines), "solo").iloc[0]
    da = np.array([0.06 + 0.01 * r for r in range(3)])
    assert t.context_len == pytest.approx(da.mean() / 8e-6, rel=1e-6) and t.n_engines == 3 and t.arm == "solo"
    assert t.ci_low is None or t.ci_low >= 4096


def test_colocation_effect_is_paired_by_round():
    lines = {}
    extra = [0.028, 0.031, 0.033]  # co-location adds ~30 us to fp8's fixed cost only
    for arm in ("colocated", "solo"):
        for r in range(3):
            lines[(arm, r, "auto")] = (5.0 + 0.01 * r, 4e-5)
            lines[(arm, r, "fp8")] = (5.05 + 0.01 * r + (extra[r] if arm == "colocated" else 0.0), 3e-5)
    m = pd.concat(
        [_rows({(r, d): v for (a, r, d), v in lines.items() if a == arm}, arm=arm) for arm in ("colocated", "solo")]
    )
    e = rp.arm_effect(m, layers=36).set_index("kv_dtype")
    x = np.array(extra)
    h = T2 * x.std(ddof=1) / math.sqrt(3)
    assert e.loc["fp8-auto", "effect_ms"] == pytest.approx(x.mean())
    assert (e.loc["fp8-auto", "effect_ms_ci_low"], e.loc["fp8-auto", "effect_ms_ci_high"]) == pytest.approx(
        (x.mean() - h, x.mean() + h)
    )
    assert e.loc["fp8-auto", "effect_us_per_layer"] == pytest.approx(x.mean() * 1e3 / 36)
    assert e.loc["fp8-auto", "resolved"] and e.loc["fp8-auto", "n_rounds"] == 3
    assert e.loc["auto", "effect_ms"] == pytest.approx(0.0, abs=1e-12)


# ------------------------------------------------------------------------------------------------ resuming a run
def _spec():
    from fp8lab import decode

    return decode.DecodeSpec(
        model="data/models/fp8lab-tiny-qwen3",
        contexts=[128, 256, 512],
        batches=[1],
        reps=2,
        engines=3,
        arms=["colocated", "solo"],
        kv_cache_gib=0.25,
        enforce_eager=True,
        max_model_len=2048,
        max_num_batched_tokens=2048,
    )


def _engine_rows(engine: str, uid: str, points, reps, group="g0"):
    arm, rnd, d = engine.split("/")
    return [
        {"group": group, "arm": arm, "round": int(rnd[1:]), "kv_dtype": d, "engine": engine, "engine_uid": uid}
        | {"batch": b, "context_len": c, "rep": r, "step_s": 0.001 * (1 + r), "full_batch": True}
        for b, c in points
        for r in range(reps)
    ]


def test_a_resumed_run_redoes_unfinished_sets_whole_and_keeps_the_complete_attempt(tmp_path):
    from fp8lab.decode import run as drun

    spec = _spec()
    pts = [(1, 128), (1, 256), (1, 512)]
    rows = _engine_rows("colocated/r0/auto", "colocated/r0/auto#1", pts, 2)
    rows += _engine_rows("colocated/r0/fp8", "colocated/r0/fp8#1", pts, 2)
    rows += _engine_rows("solo/r0/auto", "solo/r0/auto#1", pts, 2)
    rows += _engine_rows("solo/r0/fp8", "solo/r0/fp8#1", pts[:2], 2)  # cut short by the call's end
    todo = [s.key for s in drun.sets_to_run(spec, rows, "g0", pts)]
    assert todo == [s.key for s in spec.schedule()][2:]  # the co-located pair and solo auto are done
    assert drun.sets_to_run(spec, rows, "g0", pts, failed={"solo/r0/fp8"})[0].key == "solo/r1/fp8"
    # the fresh attempt of solo/r0/fp8 measures everything: it is the one used, the half attempt stays in the store
    rows += _engine_rows("solo/r0/fp8", "solo/r0/fp8#2", pts, 2)
    run = drun.DecodeRun(tmp_path, {"spec": spec.descriptor()["spec"]}, pd.DataFrame(rows), {}, {}, False)
    m = run.measured()
    assert set(m[m.engine == "solo/r0/fp8"].engine_uid) == {"solo/r0/fp8#2"} and len(m) == 4 * 6
    assert run.replicated and m.step_ms.max() == pytest.approx(2.0)


def test_the_next_set_waits_when_the_cheapest_engine_time_says_it_would_not_finish():
    from fp8lab.decode.worker import _set_estimate

    assert _set_estimate({}, 2) is None
    # the first (co-located) set paid a 144 s compile; a solo set took 60 s: the next pair needs about 120 s
    assert _set_estimate({2: 220.0, 1: 60.0}, 2) == pytest.approx(120.0)
    assert _set_estimate({2: 220.0}, 1) == pytest.approx(110.0)


def test_the_next_engine_waits_for_the_last_ones_device_memory():
    from fp8lab.decode.worker import _wait_released

    class Probe:  # NVML's used bytes falling as the stopped engine's process exits
        kind = "gpu"

        def __init__(self, seq):
            self.seq = list(seq)

        def used_bytes(self):
            return self.seq.pop(0) if len(self.seq) > 1 else self.seq[0]

    gib = 2**30
    p = Probe([80 * gib, 40 * gib, gib // 2])
    assert 0.9 <= _wait_released(p, baseline=0) < 5 and p.seq == [gib // 2]
    assert _wait_released(Probe([80 * gib]), baseline=0, timeout_s=0.6) >= 0.6  # gives up, the start will say why
    cpu = Probe([80 * gib])
    cpu.kind = "cpu_rss"
    assert _wait_released(cpu, baseline=0) == 0.0


# ------------------------------------------------------------------------------------------------ summary and index
def _replicated_run(tmp_path):
    """A replicated run's store rows built from lines: fp8 +60 us of fixed cost (+90 co-located), 8 us per 1K tokens
    cheaper; engines differ by a few us of fixed cost."""
    from fp8lab.decode import run as drun

    spec = _spec()
    rows = []
    for arm in ("colocated", "solo"):
        for r in range(3):
            off = [0.0, 0.004, -0.003][r]
            for d, (a, b) in {"auto": (5.0, 4e-5), "fp8": (5.06 + (0.03 if arm == "colocated" else 0), 3.2e-5)}.items():
                for c in spec.contexts:
                    for rep in range(spec.reps):
                        step = (a + off + b * c) * (1 + 1e-4 * (-1) ** rep)
                        rows.append(
                            {"group": "g0", "arm": arm, "round": r, "kv_dtype": d, "engine": f"{arm}/r{r}/{d}"}
                            | {"engine_uid": f"{arm}/r{r}/{d}#1", "batch": 1, "context_len": c, "rep": rep}
                            | {"step_s": step / 1e3, "full_batch": True}
                        )
    desc = {"study": "06_decode", "spec": spec.descriptor()["spec"]}
    prov = {"device": "NVIDIA H200"}
    blocks = {d: kvmath.predict_num_blocks(spec.model, 2**28, 128, d) for d in ("auto", "fp8")}  # 0.25 GiB of KV
    starts = {
        f"g0/{a}/r{r}/{d}": {"status": "ok", "arm": a, "round": r, "kv_dtype": d, "num_blocks": blocks[d]}
        | {"block_size": 128, "engine_uid": f"{a}/r{r}/{d}#1"}
        for a in ("colocated", "solo")
        for r in range(3)
        for d in ("auto", "fp8")
    }
    engines = {d: {"status": "ok"} for d in ("auto", "fp8")}
    return drun.DecodeRun(tmp_path, desc, pd.DataFrame(rows), engines, prov, True, starts)


def test_replicated_summary_rows_and_index(tmp_path):
    from fp8lab import decode
    from fp8lab import summary_table as st
    from fp8lab.report.index import key_numbers

    run = _replicated_run(tmp_path)
    s = decode.summary(run, 4000.0)
    assert s["replicated"] and s["primary_arm"] == "solo" and s["engines_per_dtype"] == 3
    assert [p["n_engines"] for p in s["points"]] == [3, 3, 3] and {p["arm"] for p in s["points"]} == {"solo"}
    fit = {(f["arm"], f["kv_dtype"]): f for f in s["fits"]}
    assert fit["solo", "fp8-auto"]["a_ms"] == pytest.approx(0.06, abs=1e-4)
    assert fit["colocated", "fp8-auto"]["a_ms"] == pytest.approx(0.09, abs=1e-4)
    assert fit["solo", "fp8-auto"]["a_us_per_layer"] == pytest.approx(60 / 6, rel=2e-3)  # the shipped model: 6 layers
    eff = {e["kv_dtype"]: e for e in s["arm_effect"]}
    assert eff["fp8-auto"]["effect_ms"] == pytest.approx(0.03, abs=1e-4) and eff["fp8-auto"]["resolved"]
    cross = {c["arm"]: c for c in s["crossovers"]}
    assert (
        cross["solo"]["context_len"] == pytest.approx(0.06 / 8e-6, rel=2e-3) and cross["solo"]["status"] == "above_grid"
    )
    rows = decode.summary_rows(run)
    st.validate(rows)
    metrics = {r["metric"] for r in rows}
    assert metrics == {"decode_step_ms", "decode_step_ms_colocated", "decode_fixed_ms", "decode_crossover_tokens"} | {
        "num_blocks",
        "num_blocks_formula",
    }
    assert all(r["n"] == 3 for r in rows if r["metric"].startswith("decode"))
    assert s["capacity_exact"] is True
    idx = dict(key_numbers("06_decode_speed", s, rows))
    assert idx["batch 1: fp8 − auto fixed cost per decode step (3 engine pairs)"].startswith("60")
    assert idx["grid points (batch x context) measured by both dtypes"] == "3"  # the solo arm's, not both arms'
    text = "\n".join(decode.verdict(s))
    assert "3 fresh engines per dtype started in ABBA order" in text and "Co-location, batch 1" in text
    assert "co-location changes it" in text
