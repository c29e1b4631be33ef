"""Study 04 on real vLLM (CPU build), small: a two-length ramp per dtype with the quality phases on the same
engines, and one boundary probe per dtype (four engine starts, about two minutes on an idle 2-core machine).

The KV budget is chosen by hand so the boundary falls inside the run. Tiny model: 3072 B/token (auto) and 1536
(fp8), 128-token blocks. 0.0045 GiB = 4,831,838 B gives 12 blocks (auto) and 24 (fp8). Usable: 11 and 23, so the
longest contexts are 1408 and 2944 tokens. Requests of 1008 + 16 = 1024 tokens take 8 blocks each: auto holds one
at a time, fp8 holds two. Requests of 512 + 16 take 5 blocks each, so both dtypes hold two."""

from __future__ import annotations

import math

import pytest

from fp8lab import longctx as lc

pytestmark = [
    pytest.mark.slow,
    pytest.mark.native_fp8,
]  # FP8 engines: skipped without the kernel (test_degraded.py covers that)

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
        quality_random_docs=1,
        passkey_lengths=(256,),
        passkey_depths=(0.5,),
        top_k=3,
        position_bins=4,
    )
    res = lc.run_study(plan, study="test_longctx", progress=False)
    return plan, res, lc.tables(res)


def test_engines_and_boundary(study):
    plan, res, t = study
    eng = res.engines.set_index(["role", "kv_dtype"])
    assert eng.loc[("ramp", "auto"), "status"] == eng.loc[("ramp", "fp8"), "status"] == "ok"
    assert eng.loc[("ramp", "auto"), "num_blocks"] == 12 and eng.loc[("ramp", "fp8"), "num_blocks"] == 24
    b = t.boundary.set_index("kv_dtype")
    assert list(b.longest_formula) == [11 * 128, 23 * 128]
    # one block beyond the prediction: vLLM refuses to start (status oom) and states the same boundary itself
    assert list(b.over_status) == ["oom", "oom"] and list(b.max_model_len_over) == [12 * 128, 24 * 128]
    assert list(b.longest_measured) == list(b.longest_formula)


def test_ramp_records(study):
    plan, res, t = study
    r = t.ramp.set_index(["kv_dtype", "concurrency", "length"])
    for dt in plan.kv_dtypes:
        for L in plan.lengths:
            row = r.loc[(dt, 1, L)]
            assert row.outcome == "ok" and row.n == 1 and row.n_itl == plan.output_tokens - 1
            assert 0 < row.itl_p50_s <= row.itl_p95_s and row.ttft_p50_s > 0
            # sampled KV use of one sequence: at most ceil((L + 16) / 128) blocks; NaN when the 0.1 s sampler caught
            # no step of a short phase
            assert not row.blocks_used_peak > lc.blocks_for(L + 16, 128)
        assert r.loc[(dt, 1, 1008), "ttft_p50_s"] > r.loc[(dt, 1, 512), "ttft_p50_s"]
    assert not r.loc[("fp8", 2, 1008), "blocks_used_peak"] > 16  # two sequences of 8 blocks
    assert r.loc[("auto", 2, 512), "outcome"] == "held" and r.loc[("fp8", 2, 512), "outcome"] == "held"
    assert r.loc[("fp8", 2, 1008), "outcome"] == "held"
    assert r.loc[("auto", 2, 1008), "outcome"] in ("preempted", "serialized")  # 16 blocks > 11 usable


def test_frontier(study):
    _, _, t = study
    f = t.frontier.set_index(["kv_dtype", "length"])
    assert f.loc[("auto", 1008), "max_conc_formula"] == 1 and f.loc[("fp8", 1008), "max_conc_formula"] == 2
    assert f.loc[("auto", 512), "max_conc_formula"] == 2 and f.loc[("fp8", 512), "max_conc_formula"] == 4
    assert (f.max_conc_engine == f.max_conc_formula).all()


def test_quality_phases_on_the_ramp_engines(study):
    plan, res, t = study
    assert plan.quality_merged and len(res.runs) == 4  # no extra engine for quality
    div = t.divergence
    assert set(div.source) == {"text", "random"} and set(div.kv_dtype) == {"fp8"}
    assert len(div) == 2 * (plan.doc_length - 1)
    assert div.abs_dlogprob.max() > 0 and div.kl.min() >= 0 and div.top1.between(0, 1).all()
    assert len(t.bypos) == 2 * 4
    pk = t.passkey
    assert len(pk) == 2 and set(pk.kv_dtype) == {"auto", "fp8"} and pk.answer.map(len).gt(0).all()


def test_random_token_timing_and_noise(study):
    _, _, t = study
    tim = t.random[t.random.what == "timing"]
    assert set(tim.kv_dtype) == {"auto", "fp8"}
    assert tim.ttft_ratio.map(math.isfinite).all() and tim.noise_ttft_ratio.map(math.isfinite).all()


def test_verdict_and_summary(study):
    _, res, t = study
    c = lc.claims(res, t)
    assert c["oom"]["longest_held_at_concurrency"] == {"auto": 512, "fp8": 1008}
    assert c["oom"]["label"] == "supported"
    s = lc.summary_values(res, t, c)
    assert s["auto.longest_measured"] == 1408 and s["fp8.longest_measured"] == 2944
    assert "1,408" in lc.verdict_markdown(res, t, c)
