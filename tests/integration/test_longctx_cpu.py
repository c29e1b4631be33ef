"""Study 04 on real vLLM (CPU build), small: a two-length ramp per dtype with the quality phases on the same
engines, and one boundary probe per dtype (four engine starts, about two minutes on an idle 2-core machine).

The KV budget is chosen by hand so the boundary falls inside the run. Tiny model: 3072 B/token (auto) and 1536
(fp8), 128-token blocks. 0.0045 GiB = 4,831,838 B gives 12 blocks (auto) and 24 (fp8). Usable: 11 and 23, so the
longest contexts are 1408 and 2944 tokens. Requests of 1008 + 16 = 1024 tokens take 8 blocks each: auto holds one
at a time, fp8 holds two. Requests of 512 + 16 take 5 blocks each, so both dtypes hold two.

Without the native FP8 KV kernel fp8's ramp and probe are recorded ``unsupported`` (its capacities are the formula's)
and its quality phases run on a fifth, emulated engine (``fp8 (emulated)``, :mod:`fp8lab.engine.fp8emu`): auto's boundary
and ramp are measured as natively, fp8's divergence and passkey come from the emulation, fp8's timing from nowhere."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fp8lab import longctx as lc
from fp8lab.engine.capability import kv_support

pytestmark = pytest.mark.slow

NATIVE = kv_support("fp8").native
FP8 = "fp8" if NATIVE else "fp8 (emulated)"  # the label fp8's quality phases ran under

KV_GIB = 0.0045


@pytest.fixture(scope="module")
def study(tiny_model, runs_root):
    plan = lc.LongCtxPlan(
        model=tiny_model,
        lengths=(512, 1008),
        output_tokens=16,
        concurrency=2,
        block_size=128,
        kv_cache_gib=KV_GIB,
        random_token_lengths=(1008,),
        quality_model=tiny_model,
        quality_length=256,  # scored through the cache, one decode step per token: the ramp's 1,008 took minutes emulated
        quality_random_docs=1,
        passkey_lengths=(256,),
        passkey_depths=(0.1, 0.5, 0.9),  # as the notebook tier's profile, which loads these engines
        top_k=3,
        position_bins=4,
    )
    # the notebook's study name: the notebook tier's profile (cpu-ci, and cpu-ci-emulated on a CPU without the FP8
    # kernel) runs this plan, so tests/notebooks/test_nb04.py loads these engines from the session's store
    res = lc.run_study(plan, progress=False)
    return plan, res, lc.tables(res)


def test_engines_and_boundary(study):
    plan, res, t = study
    eng = res.engines.set_index(["role", "kv_dtype"])
    b = t.boundary.set_index("kv_dtype")
    assert list(b.longest_formula) == [11 * 128, 23 * 128]
    if not NATIVE:  # auto measured as natively; fp8 refused before a start, its boundary the formula's alone
        assert eng.loc[("ramp", "auto"), "status"] == "ok" and eng.loc[("ramp", "auto"), "num_blocks"] == 12
        assert eng.loc[("ramp", "fp8"), "status"] == eng.loc[("probe", "fp8"), "status"] == "unsupported"
        assert b.loc["auto", "over_status"] == "oom" and b.loc["auto", "max_model_len_over"] == 12 * 128
        assert b.loc["auto", "longest_measured"] == b.loc["auto", "longest_formula"]
        assert b.loc["fp8", "over_status"] == "unsupported" and pd.isna(b.loc["fp8", "longest_measured"])
        return
    assert eng.loc[("ramp", "auto"), "status"] == eng.loc[("ramp", "fp8"), "status"] == "ok"
    assert eng.loc[("ramp", "auto"), "num_blocks"] == 12 and eng.loc[("ramp", "fp8"), "num_blocks"] == 24
    # one block beyond the prediction: vLLM refuses to start (status oom) and states the same boundary itself
    assert list(b.over_status) == ["oom", "oom"] and list(b.max_model_len_over) == [12 * 128, 24 * 128]
    assert list(b.longest_measured) == list(b.longest_formula)


def test_ramp_records(study):
    plan, res, t = study
    r = t.ramp.set_index(["kv_dtype", "concurrency", "length"])
    if not NATIVE:  # no fp8 ramp without the kernel: every fp8 point says so
        assert (r.loc["fp8"].outcome == "unsupported").all()
    for dt in plan.kv_dtypes if NATIVE else ["auto"]:
        for L in plan.lengths:
            row = r.loc[(dt, 1, L)]
            # one gap per token after the first; a first delta that already held two tokens (the client lagged at the
            # first token, seen on a fast AMX host) leaves the gap inside it unobserved (fp8lab.engine.worker)
            assert row.outcome == "ok" and row.n == 1 and plan.output_tokens - 2 <= row.n_itl <= plan.output_tokens - 1
            assert 0 < row.itl_p50_s <= row.itl_p95_s and row.ttft_p50_s > 0
            # sampled KV use of one sequence: at most ceil((L + 16) / 128) blocks; NaN when the 0.1 s sampler caught
            # no step of a short phase
            assert not row.blocks_used_peak > lc.blocks_for(L + 16, 128)
        assert r.loc[(dt, 1, 1008), "ttft_p50_s"] > r.loc[(dt, 1, 512), "ttft_p50_s"]
    assert r.loc[("auto", 2, 512), "outcome"] == "held"
    assert r.loc[("auto", 2, 1008), "outcome"] in ("preempted", "serialized")  # 16 blocks > 11 usable
    if NATIVE:
        assert not r.loc[("fp8", 2, 1008), "blocks_used_peak"] > 16  # two sequences of 8 blocks
        assert r.loc[("fp8", 2, 512), "outcome"] == "held" and r.loc[("fp8", 2, 1008), "outcome"] == "held"


def test_frontier(study):
    _, _, t = study
    f = t.frontier.set_index(["kv_dtype", "length"])
    assert f.loc[("auto", 1008), "max_conc_formula"] == 1 and f.loc[("fp8", 1008), "max_conc_formula"] == 2
    assert f.loc[("auto", 512), "max_conc_formula"] == 2 and f.loc[("fp8", 512), "max_conc_formula"] == 4
    measured = f if NATIVE else f.loc[["auto"]]  # fp8's engine did not start without the kernel
    assert (measured.max_conc_engine == measured.max_conc_formula).all()
    if not NATIVE:
        assert f.loc["fp8"].max_conc_engine.isna().all()


def test_quality_phases_on_the_ramp_engines(study):
    plan, res, t = study
    if NATIVE:
        assert plan.quality_merged and len(res.runs) == 4  # no extra engine for quality
    else:  # one extra engine: fp8's quality phases, emulated
        assert plan.quality_merged and len(res.runs) == 5 and res.emulated == [FP8]
        assert [r["result"].status for r in res.runs if r["role"] == lc.EMULATED_ROLE] == ["ok"]
    div = t.divergence
    assert set(div.source) == {"text", "random"} and set(div.kv_dtype) == {FP8}
    assert len(div) == 2 * (plan.doc_length - 1)
    assert div.abs_dlogprob.max() > 0 and div.kl.min() >= 0 and div.top1.between(0, 1).all()
    assert len(t.bypos) == 2 * 4
    pk = t.passkey
    assert len(pk) == 2 * 3 and set(pk.kv_dtype) == {"auto", FP8} and pk.answer.map(len).gt(0).all()


def test_random_token_timing_and_noise(study):
    _, _, t = study
    tim = t.random[t.random.what == "timing"]
    assert set(tim.kv_dtype) == ({"auto", "fp8"} if NATIVE else {"auto"})  # an emulated engine is never timed
    assert tim.ttft_ratio.map(math.isfinite).all() and tim.noise_ttft_ratio.map(math.isfinite).all()


def test_verdict_and_summary(study):
    _, res, t = study
    c = lc.claims(res, t)
    s = lc.summary_values(res, t, c)
    if not NATIVE:  # auto measured; fp8's longest context the formula's only; its divergence under its own label
        assert c["oom"]["longest_held_at_concurrency"] == {
            "auto": 512,
            "fp8": "not run",
        }  # never ran a concurrent request (issue 36)
        assert s["auto.longest_measured"] == 1408 and s["fp8.longest_measured"] is None
        assert s["fp8.longest_formula"] == 2944 and s["emulated"] == [FP8]
        assert s[f"{FP8}.text.div.abs_dlogprob"] > 0 and not any(k.startswith("fp8.text.") for k in s)
        assert "1,408" in lc.verdict_markdown(res, t, c)
        return
    assert c["oom"]["longest_held_at_concurrency"] == {"auto": 512, "fp8": 1008}
    assert c["oom"]["label"] == "supported"
    assert s["auto.longest_measured"] == 1408 and s["fp8.longest_measured"] == 2944
    assert "1,408" in lc.verdict_markdown(res, t, c)
