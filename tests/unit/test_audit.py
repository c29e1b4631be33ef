"""The claims audit's rules on hand-built evidence: each rule must flip when the numbers do.

Summaries are built with the keys the studies record (see ``serving.summary_values``,
``calibration.headline``, ``quality.headline``, ``longctx.summary_values``, ``capacity.summarize``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fp8lab import audit, kvmath
from fp8lab.audit import CONFIRMED, DEPENDS, NOT_TESTABLE, REFUTED, Evidence, Finding, Report
from fp8lab.paths import CONFIGS_DIR, REPO_ROOT
from fp8lab.report import write_index
from fp8lab.specs import SpecError

STEMS = {"00": "00_kv_memory_estimation", "01": "01_kv_dtype_auto_vs_fp8", "02": "02_calibration_32_tokens",
         "03": "03_quality_token_match", "04": "04_long_context_ramp_128k"}


def rep(label: str = "p", path: Path = Path("/nowhere/p"), **studies) -> Report:
    """A report from ``s00=..., s01=...`` summaries."""
    return Report(label, path, {STEMS[k[1:]]: v for k, v in studies.items()})


def ev(*reports: Report, **kw) -> Evidence:
    return Evidence(tuple(reports), **kw)


def run(claim_id: int, evidence: Evidence) -> Finding:
    return audit.RULES[claim_id].fn(evidence)


def d(delta: float, lo: float, hi: float, label: str | None = None) -> dict:
    """A recorded Study 01 delta; the label follows from the CI unless given (latency: pass it)."""
    if label is None:
        label = "within noise" if lo <= 0 <= hi else ("better" if lo > 0 else "worse")
    return {"delta_pct": delta, "lo_pct": lo, "hi_pct": hi, "label": label}


def s01(deltas: dict, concurrency=(1, 8, 16), **extra) -> dict:
    return {"kv_dtypes": ["auto", "fp8"], "concurrency": list(concurrency), "headline_concurrency": max(concurrency),
            "deltas": {f"fp8: {k}": v for k, v in deltas.items()}, **extra}


# ------------------------------------------------------------------------------------------ the machinery
def test_every_claim_has_a_rule_with_text():
    assert [c.id for c in audit.CLAIMS] == list(range(1, 16))
    assert set(audit.RULES) == {c.id for c in audit.CLAIMS}
    for r in audit.RULES.values():
        assert len(r.text) > 80, r.claim_id  # the docstring is the rule shown beside the verdict


def test_combine_agree_disagree_untestable():
    a, b = Finding(REFUTED, "x", "why a"), Finding(CONFIRMED, "y", "why b")
    nt = Finding(NOT_TESTABLE, "z", "run it")
    assert audit.combine({"cpu": a, "gpu": nt}).verdict == REFUTED
    mixed = audit.combine({"cpu": a, "gpu": b})
    assert mixed.verdict == DEPENDS and "cpu: refuted" in mixed.on_what and "gpu: confirmed" in mixed.on_what
    assert mixed.by_report == {"cpu": REFUTED, "gpu": CONFIRMED}
    assert audit.combine({"cpu": nt}).verdict == NOT_TESTABLE
    assert audit.combine({}).verdict == NOT_TESTABLE
    with pytest.raises(SpecError, match="Finding.verdict = 'maybe'"):
        Finding("maybe", "")


def test_direction_uses_the_ci_label_and_the_claimed_size():
    assert audit.direction(d(-5, -8, -2), "worse") == "holds"
    assert audit.direction(d(5, 2, 8), "worse") == "contradicted"
    assert audit.direction(d(-1, -3, 1), "worse", claimed_pct=-7.9) == "contradicted"  # CI excludes the claim
    assert audit.direction(d(-1, -9, 1), "worse", claimed_pct=-7.9) == "unresolved"  # CI holds 0 and the claim


def test_no_evidence_never_crashes():
    rows = audit.audit(ev())
    assert [r["id"] for r in rows] == list(range(1, 16))
    by = {r["id"]: r["verdict"] for r in rows}
    # no reports, no configs, no vLLM: only the format arithmetic is left (it needs torch's FP8 dtypes)
    try:
        import torch  # noqa: F401

        assert by[9] == REFUTED
    except ImportError:
        assert by[9] == NOT_TESTABLE
    assert all(by[i] == NOT_TESTABLE for i in by if i != 9)
    assert not any("rule failed" in r["measured"] for r in rows)


def test_a_failing_rule_is_reported_not_raised(monkeypatch):
    def boom(_ev):
        raise ZeroDivisionError("x")

    monkeypatch.setitem(audit.RULES, 2, audit.Rule(2, boom, "t"))
    row = next(r for r in audit.audit(ev()) if r["id"] == 2)
    assert row["verdict"] == NOT_TESTABLE and "rule failed: ZeroDivisionError" in row["measured"]


# ------------------------------------------------------------------------------------------ claims 1, 2
def _layout(name: str, heads: int, kv: int, layers: int = 80, head_dim: int = 128) -> kvmath.KVLayout:
    return kvmath.load_layout({"model_type": "llama", "num_hidden_layers": layers, "num_attention_heads": heads,
                               "num_key_value_heads": kv, "head_dim": head_dim, "torch_dtype": "bfloat16"}, name)


def test_claim1_refuted_for_gqa_with_the_head_ratio():
    f = run(1, ev(configs=audit.default_configs()))
    assert f.verdict == REFUTED
    rows = {r["model"]: r for r in f.details["configs"]}
    assert rows["llama-3-70b"]["overstatement"] == 8  # 64 attention heads, 8 KV heads
    assert rows["qwen3-14b"]["overstatement"] == 5  # 40 / 8
    assert rows["llama-3-70b"]["kv_bytes_per_token"] == 327680  # 2 x 80 x 8 x 128 x 2
    assert "deepseek-v2-lite" not in rows  # MLA: another formula


def test_claim1_confirmed_for_multi_head_only():
    f = run(1, ev(configs=(_layout("mha-a", 32, 32), _layout("mha-b", 16, 16))))
    assert f.verdict == CONFIRMED and f.details["max_overstatement"] == 1


def test_claim1_engine_check_from_a_study00_summary():
    tiny = kvmath.load_layout("data/models/fp8lab-tiny-qwen3")  # 4 attention heads, 2 KV heads
    s00 = {"model": "fp8lab-tiny-qwen3", "measured": {"auto": {"status": "ok", "block_size": 128,
                                                               "kv_budget_bytes": 2**30, "engine_blocks": 2730,
                                                               "predicted_blocks": 2730}}}
    f = run(1, ev(rep("cpu", s00=s00), configs=(tiny,)))
    e = f.details["engine"]["cpu"]
    assert e["claim_formula_blocks"] == 2**30 // (128 * 2 * 6 * 4 * 64 * 2) == 1365
    assert f.verdict == REFUTED and "predicts 1365" in f.measured


def test_claim1_cites_the_engines_on_record():
    """Study 00's section 6 (capacity.summarize_records) over the committed H200 stores, as the audit reads it."""
    from fp8lab import capacity

    root = str(REPO_ROOT / "reports" / "h200" / "records")
    s00 = {"model": "fp8lab-tiny-qwen3", "records": capacity.summarize_records(capacity.records_check([root]), [root])}
    f = run(1, ev(rep("h200", s00=s00), configs=audit.default_configs()))
    assert f.details["on_record"]["h200"]["exact"] == f.details["on_record"]["h200"]["compared"] == 19
    assert "[h200] engines on record (NVIDIA H200; 3 studies): KV-heads formula exact for 19 of 19" in f.measured
    assert "engines on record" not in run(1, ev(rep("h200", s00={"model": "x"}), configs=audit.default_configs())).measured


def test_claim2_totals_and_ratio():
    f = run(2, ev(configs=audit.default_configs()))
    assert f.verdict == REFUTED
    assert f.details["bytes_per_token_fp16"] == 327680 and f.details["ratio"] == 2
    assert f.details["total_fp16_bytes"] == 327680 * 131072  # 42.9 GB, not 128
    assert f.details["total_holds"] is False
    # a Llama-3-70B with 24 KV heads would need 128.8 GB: the total part flips, the "32 to 8" part cannot
    fake = _layout("llama-3-70b", 64, 24)
    g = run(2, ev(configs=(fake,)))
    assert g.details["total_holds"] is True and g.details["ratio_holds"] is False and g.verdict == REFUTED
    assert run(2, ev()).verdict == NOT_TESTABLE


# ------------------------------------------------------------------------------------------ claim 3
S00 = {"kv_dtypes": ["auto", "fp8"], "kv_ratio_vs_first": {"auto": 1.0, "fp8": 0.5}, "memory_batch": 32,
       "memory_context_len": 8192, "total_memory_vs_first": {"qwen3-14b": {"auto": 1.0, "fp8": 0.70},
                                                             "llama-2-70b": {"auto": 1.0, "fp8": 0.81}}}


def _mem(auto: float, fp8: float) -> dict:
    return {"kv_dtypes": ["auto", "fp8"], "mem_peak_gib_auto": auto, "mem_peak_gib_fp8": fp8}


def test_claim3_depends_when_vllm_reserves_the_same_memory():
    f = run(3, ev(rep(s00=S00, s01=_mem(60.0, 59.9))))
    assert f.verdict == DEPENDS and "reserves its KV budget" in f.on_what
    assert f.details["p"]["arithmetic_drop"]["qwen3-14b"] == pytest.approx(0.30)


def test_claim3_confirmed_by_a_drop_in_the_band_refuted_without_halving():
    assert run(3, ev(rep(s00=S00, s01=_mem(68.2, 52.7)))).verdict == CONFIRMED  # the claim's own numbers
    bad = {**S00, "kv_ratio_vs_first": {"auto": 1.0, "fp8": 0.6}}
    assert run(3, ev(rep(s00=bad, s01=_mem(60, 60)))).verdict == REFUTED
    assert run(3, ev(rep())).verdict == NOT_TESTABLE


# ------------------------------------------------------------------------------------------ claim 4
def _cap(auto, fp8, censored=False) -> dict:
    return {"kv_dtypes": ["auto", "fp8"], "max_concurrency_measured_auto": auto, "max_concurrency_measured_fp8": fp8,
            "max_concurrency_censored_auto": censored, "max_concurrency_censored_fp8": False}


def test_claim4_ratio_decides():
    f = run(4, ev(rep(s01=_cap(31, 63))))
    assert f.verdict == DEPENDS and f.details["p"]["ratio"] == pytest.approx(63 / 31) and "doubles" in f.on_what
    assert "+50%" in run(4, ev(rep(s01=_cap(16, 24)))).on_what
    assert run(4, ev(rep(s01=_cap(16, 17)))).verdict == REFUTED
    assert run(4, ev(rep(s01=_cap(16, 32, censored=True)))).verdict == NOT_TESTABLE
    s04 = {"kv_dtypes": ["auto", "fp8"], "lengths": [512, 1024], "auto.max_conc_measured.L512": 16,
           "fp8.max_conc_measured.L512": 32}
    g = run(4, ev(rep(s04=s04)))
    assert g.verdict == DEPENDS and "04 frontier" in g.measured


def test_claim4_frontier_skips_a_scheduler_cap():
    # as on the H200: max_num_seqs (128) binds both dtypes at 1K and fp8 at 2K; KV binds from 4K on
    vals = {"auto": [128, 84, 42, 21], "fp8": [128, 128, 84, 42]}
    lengths = [1024, 2048, 4096, 8192]
    s04 = {"kv_dtypes": ["auto", "fp8"], "lengths": lengths,
           **{f"{dt}.max_conc_measured.L{x}": v for dt, vs in vals.items() for x, v in zip(lengths, vs, strict=True)}}
    g = run(4, ev(rep(s04=s04)))
    assert g.details["p"]["ratio"] == pytest.approx(2.0) and "4,096 tokens" in g.measured


# ------------------------------------------------------------------------------------------ claim 5
def test_claim5_three_directions():
    ok = {"output tok/s @c=16": d(-8, -12, -4), "TTFT P50 @c=16": d(-7, -10, -3, "better"),
          "TPOT P50 @c=16": d(20, 10, 30, "worse")}
    assert run(5, ev(rep(s01=s01(ok)))).verdict == CONFIRMED
    faster = {**ok, "output tok/s @c=16": d(9, 5, 15)}
    f = run(5, ev(rep(s01=s01(faster))))
    assert f.verdict == REFUTED and f.details["p"]["parts"]["output tok/s"] == "contradicted"
    wide = {k: d(0, -40, 40, "within noise") for k in ok}
    assert run(5, ev(rep(s01=s01(wide)))).verdict == NOT_TESTABLE
    assert run(5, ev(rep(s01=s01({})))).verdict == NOT_TESTABLE  # no deltas recorded: said, not raised


def test_two_profiles_that_disagree_depend_on_the_setting():
    ok = {"output tok/s @c=16": d(-8, -12, -4), "TTFT P50 @c=16": d(-7, -10, -3, "better"),
          "TPOT P50 @c=16": d(20, 10, 30, "worse")}
    bad = {**ok, "output tok/s @c=16": d(9, 5, 15)}
    f = run(5, ev(rep("cpu-tiny", s01=s01(bad)), rep("h200", s01=s01(ok))))
    assert f.verdict == DEPENDS and f.by_report == {"cpu-tiny": REFUTED, "h200": CONFIRMED}


# ------------------------------------------------------------------------------------------ claim 6
def _ramp(e2e_auto: float, e2e_fp8: float, auto_outcome: str = "serialized") -> dict:
    return {"kv_dtypes": ["auto", "fp8"], "concurrency": 2, "lengths": [512, 8160],
            "auto.c2.L512.outcome": "held", "fp8.c2.L512.outcome": "held",
            "auto.c2.L8160.outcome": auto_outcome, "fp8.c2.L8160.outcome": "held",
            "auto.c2.L8160.e2e_p50_s": e2e_auto, "fp8.c2.L8160.e2e_p50_s": e2e_fp8}


def test_claim6_capacity_and_speed():
    assert run(6, ev(rep(s04=_ramp(6.0, 5.0)))).verdict == CONFIRMED  # +20%
    f = run(6, ev(rep(s04=_ramp(5.0, 8.0))))
    assert f.verdict == DEPENDS and f.details["p"]["gain"] == pytest.approx(5 / 8 - 1)
    assert run(6, ev(rep(s04=_ramp(6.0, 5.0, auto_outcome="held")))).verdict == NOT_TESTABLE  # no limit reached
    # Study 01 alone: auto preempted where fp8 did not; no timed long requests
    only01 = {"kv_dtypes": ["auto", "fp8"], "headline_concurrency": 16, "preemptions_auto": 3.0, "preemptions_fp8": 0.0}
    assert run(6, ev(rep(s01=only01))).verdict == NOT_TESTABLE


# ------------------------------------------------------------------------------------------ claim 7
def test_claim7_loss_grows_and_latency_barely_moves():
    tp = {"output tok/s @c=1": d(-1.7, -3, -0.5), "output tok/s @c=8": d(-2.9, -4, -1.5),
          "output tok/s @c=16": d(-4.4, -6, -3)}
    lat = {f"{m} @c={c}": d(1, -2, 3, "within noise") for m in ("TTFT P50", "TPOT P50") for c in (1, 16)}
    assert run(7, ev(rep(s01=s01({**tp, **lat})))).verdict == CONFIRMED
    gain = {**tp, "output tok/s @c=16": d(9, 5, 15)}
    assert run(7, ev(rep(s01=s01({**gain, **lat})))).verdict == REFUTED
    shrinking = {**tp, "output tok/s @c=1": d(-6, -8, -4)}  # the largest loss at batch 1: does not grow
    assert run(7, ev(rep(s01=s01({**shrinking, **lat})))).verdict == REFUTED
    moved = {**lat, "TPOT P50 @c=16": d(20, 10, 30, "worse")}
    f = run(7, ev(rep(s01=s01({**tp, **moved}))))
    assert f.verdict == REFUTED and f.details["p"]["parts"]["latency barely moves"] == "contradicted"


# ------------------------------------------------------------------------------------------ claim 8
def _s08(naive: tuple[float, float] | None, lo: float = -5.0, hi: float = 5.0, rate_ok: bool = True) -> dict:
    """Streamed deltas at c=1 and c=16 with CI [lo, hi]; the non-reading client at c=16 with CI ``naive``."""
    tp = {f"output tok/s @c={c}": d((lo + hi) / 2, lo, hi) for c in (1, 16)}
    if naive is not None:
        tp["output tok/s (no stream) @c=16"] = d(sum(naive) / 2, *naive)
    ol = [{"kv_dtype": k, "process": "constant", "requested_rate": 8.0, "scheduled_rate": 8.0,
           "achieved_rate": 7.99 if rate_ok else 6.0} for k in ("auto", "fp8")]
    return s01(tp, concurrency=(1, 16), open_loop=ol, merged_delta_requests_frac=0.0,
               naive_concurrency=[16] if naive is not None else [])


def test_claim8_both_methods_on_the_same_engines():
    assert run(8, ev(rep(s01=_s08(naive=(20.0, 40.0))))).verdict == CONFIRMED  # beyond the streamed CI
    f = run(8, ev(rep(s01=_s08(naive=(-3.0, 8.0)))))
    assert f.verdict == REFUTED and f.details["p"]["naive_minus_streamed_pts"] == {16: pytest.approx(2.5)}
    assert run(8, ev(rep(s01=_s08(naive=(-20.0, -8.0))))).verdict == DEPENDS  # a smaller gain without the stream
    assert run(8, ev(rep(s01=_s08(naive=(-3.0, 8.0), rate_ok=False)))).verdict == NOT_TESTABLE
    assert run(8, ev(rep(s01=_s08(naive=None)))).verdict == NOT_TESTABLE  # only one method ran
    no_open = {**_s08(naive=(-3.0, 8.0)), "open_loop": []}
    assert run(8, ev(rep(s01=no_open))).verdict == REFUTED  # the open loop is a check, not required


# ------------------------------------------------------------------------------------------ claim 9
def test_claim9_formats_measured_from_torch():
    pytest.importorskip("torch")
    facts = audit.format_facts()
    e4, e5 = facts["e4m3"], facts["e5m2"]
    assert (e4["exponent_bits"], e4["mantissa_bits"], e4["max"]) == (4, 3, 448.0)
    assert (e5["exponent_bits"], e5["mantissa_bits"], e5["max"]) == (5, 2, 57344.0)
    assert e4["min_subnormal"] == 2.0**-9 and e5["min_subnormal"] == 2.0**-16
    assert e4["range_binades"] == pytest.approx(17.807, abs=1e-3) and e5["range_binades"] == pytest.approx(31.807, abs=1e-3)
    f = run(9, ev(formats=facts))
    assert f.verdict == REFUTED
    assert f.details["parts"] == {"E4M3 has 4 exponent bits": "holds",
                                  "E4M3 has the wider dynamic range": "contradicted",
                                  "E5M2 has the higher precision": "contradicted"}


def test_claim9_flips_with_swapped_formats():
    e4 = {"exponent_bits": 4, "mantissa_bits": 3, "max": 448.0, "eps": 0.5, "range_binades": 40.0}
    e5 = {"exponent_bits": 5, "mantissa_bits": 2, "max": 57344.0, "eps": 0.25, "range_binades": 30.0}
    assert run(9, ev(formats={"e4m3": e4, "e5m2": e5})).verdict == CONFIRMED
    assert run(9, ev(formats={"e4m3": {**e4, "exponent_bits": 5}, "e5m2": e5})).verdict == REFUTED


# ------------------------------------------------------------------------------------------ claim 10
def _cal(mean_tensor: float, mean_head: float) -> dict:
    return {"prompt_set": "prompt32", "calib_samples": 2400, "calib_tokens": 307200,
            "reldiff.prompt32.e4m3.tensor.mean": mean_tensor, "reldiff.prompt32.e4m3.attn_head.mean": mean_head,
            "reldiff.large.e4m3.tensor.mean": 0.5}


def test_claim10_flips_at_003():
    assert run(10, ev(rep(s02=_cal(0.029, 0.0299)))).verdict == CONFIRMED
    assert run(10, ev(rep(s02=_cal(0.031, 0.26)))).verdict == REFUTED
    f = run(10, ev(rep(s02=_cal(0.02, 0.05))))
    assert f.verdict == DEPENDS and "e4m3/tensor" in f.on_what
    assert run(10, ev(rep(s02={"prompt_set": "prompt32"}))).verdict == NOT_TESTABLE


# ------------------------------------------------------------------------------------------ claim 11
def _q03(cats: dict) -> dict:
    return {"labels": ["auto", "fp8"], "categories": list(cats), "fp8.top3_match": sum(cats.values()) / len(cats),
            **{f"fp8.top3_match.{c}": v for c, v in cats.items()}}


def test_claim11_band_and_threshold():
    good = {"quality.fp8+large-attn_head.top3_match": 0.94}
    assert run(11, ev(rep(s02=good, s03=_q03({"code": 0.9, "prose": 1.0})))).verdict == CONFIRMED
    f = run(11, ev(rep(s02=good, s03=_q03({"code": 0.8, "prose": 1.0}))))  # same scales: 0.80 and 1.00
    assert f.verdict == REFUTED and f.details["p"]["parts"]["threshold"] == "contradicted"
    low = {"quality.fp8+large-attn_head.top3_match": 0.90}
    assert run(11, ev(rep(s02=low, s03=_q03({"code": 0.9, "prose": 0.95})))).verdict == REFUTED
    # no Study 02: the band part falls back to Study 03's fp8 (default scales)
    g = run(11, ev(rep(s03=_q03({"code": 0.93, "prose": 0.95}))))
    assert g.verdict == CONFIRMED and "default scales" in g.measured


# ------------------------------------------------------------------------------------------ claim 12
def _sweep(e2e: dict, rejected=()) -> dict:
    s = {"kv_dtypes": ["auto", "fp8"]}
    for b, v in e2e.items():
        s[f"fp8.bs{b}.L8160.outcome"] = "ok"
        s[f"fp8.bs{b}.L8160.e2e_p50_s"] = v
    for b in rejected:
        s[f"fp8.bs{b}.L8160.outcome"] = "unsupported"
    return s


def test_claim12_block_256_vs_16():
    assert run(12, ev(rep(s04=_sweep({16: 12.4, 256: 5.7})))).verdict == CONFIRMED
    assert run(12, ev(rep(s04=_sweep({16: 4.0, 256: 4.4})))).verdict == REFUTED
    assert run(12, ev(rep(s04=_sweep({16: 4.0, 256: 3.9})))).verdict == REFUTED  # x0.975: within the 5% floor
    # x0.925 is beyond the 5% floor, but not beyond the profile's own one-request noise when Study 01 measured 15%
    assert run(12, ev(rep(s04=_sweep({16: 4.0, 256: 3.7})))).verdict == CONFIRMED
    noisy = s01({"TTFT P50 @c=1": {**d(3, -10, 20), "noise_floor_pct": 15.0}})
    g = run(12, ev(rep(s04=_sweep({16: 4.0, 256: 3.7}), s01=noisy)))
    assert g.verdict == REFUTED and g.details["p"]["fp8"]["noise"] == 0.15
    f = run(12, ev(rep(s04=_sweep({32: 4.8, 256: 4.0}, rejected=[16]))))
    assert f.verdict == CONFIRMED and "block 32 stands in" in f.on_what and f.details["p"]["fp8"]["rejected"] == [16]
    assert run(12, ev(rep(s04=_sweep({256: 4.3})))).verdict == NOT_TESTABLE
    assert "hit rate" in f.on_what


# ------------------------------------------------------------------------------------------ claim 13
def test_claim13_batch_and_long_context():
    tp = {"output tok/s @c=1": d(130, 100, 160), "output tok/s @c=8": d(40, 30, 50), "output tok/s @c=16": d(10, 5, 15)}
    s04 = {"kv_dtypes": ["auto", "fp8"], "lengths": [1024, 131072], "fp8.ratio_at_longest.ttft_p50_s": 0.53,
           "fp8.ratio_at_longest.itl_p50_s": 0.35}
    assert run(13, ev(rep(s01=s01(tp), s04=s04))).verdict == CONFIRMED
    grows = {**tp, "output tok/s @c=16": d(200, 150, 250)}
    assert run(13, ev(rep(s01=s01(grows), s04=s04))).verdict == REFUTED
    slower = {**s04, "fp8.ratio_at_longest.ttft_p50_s": 1.18}
    f = run(13, ev(rep(s01=s01(tp), s04=slower)))
    assert f.verdict == REFUTED and f.details["p"]["parts"]["cuts TTFT and ITL at long context"] == "contradicted"


# ------------------------------------------------------------------------------------------ claim 14
def test_claim14_per_head_and_dynamic():
    cpu = {"head_reduction.reduced": True, "head_reduction.outcome": "reduced to max over heads",
           "dynamic.offered": False, "dynamic.text": "not offered"}
    assert run(14, ev(rep(s02=cpu))).verdict == REFUTED
    gpu = {"head_reduction.reduced": False, "head_reduction.outcome": "per-head scales applied", "dynamic.offered": True}
    assert run(14, ev(rep(s02=gpu))).verdict == NOT_TESTABLE  # scales stay inside the worker
    assert run(14, ev(rep(s02={**gpu, audit.DYNAMIC_CHANGES_KEY: True}))).verdict == CONFIRMED
    assert run(14, ev(rep(s02={**gpu, audit.DYNAMIC_CHANGES_KEY: False}))).verdict == REFUTED  # computed once
    assert run(14, ev(vllm=({"version": "0.26.0", "engine_args": ["calculate_kv_scales"]},))).verdict == NOT_TESTABLE
    assert run(14, ev(vllm=({"version": "0.32.0", "engine_args": ["kv_cache_dtype"]},))).verdict == REFUTED


# ------------------------------------------------------------------------------------------ claim 15
def _opts(version: str, flags=(), fields=(), headers=("X-Request-Id",)) -> dict:
    return {"version": version, "serve_flags": ["--kv-cache-dtype", "--max-num-batched-tokens", *flags],
            "engine_args": ["kv_cache_dtype", *fields], "request_headers": list(headers)}


def test_claim15_options_per_version():
    f = run(15, ev(vllm=(_opts("0.32.0"),)))
    assert f.verdict == REFUTED and f.details["exists"]["0.32.0"]["--fp8-w8a16"] is False
    g = run(15, ev(vllm=(_opts("0.32.0"), _opts("9.9", flags=["--fp8-w8a16"]))))
    assert g.verdict == DEPENDS and "9.9: --fp8-w8a16" in g.on_what
    # an EngineArgs field counts as the option; a header naming a dtype counts as the header
    everything = _opts("9.9", fields=[o[2:].replace("-", "_") for o in audit.CLAIM15_OPTIONS],
                       headers=("X-Request-Id", "X-KV-Cache-Dtype"))
    assert run(15, ev(vllm=(everything,))).verdict == CONFIRMED
    assert run(15, ev()).verdict == NOT_TESTABLE
    table = audit.options_table(ev(vllm=(_opts("0.32.0"),)))
    near = {r["option"]: r["closest real flag"] for r in table}
    assert near["--max-num-prompt-tokens"] == "--max-num-batched-tokens"


# ------------------------------------------------------------------------------------------ loading, links, index
def _write_report(folder: Path, studies: dict) -> None:
    folder.mkdir(parents=True)
    for k, s in studies.items():
        (folder / f"{STEMS[k]}.summary.json").write_text(json.dumps(s))
        (folder / f"{STEMS[k]}.html").write_text("<html></html>")


def test_load_evidence_labels_links_and_notes(tmp_path):
    _write_report(tmp_path / "reports" / "cpu-tiny", {"01": _cap(31, 63)})
    _write_report(tmp_path / "reports" / "h200", {"01": _cap(227, 455)})
    (tmp_path / "reports" / "cpu-tiny" / "05_claims_audit.summary.json").write_text(json.dumps({"audit_rows": []}))
    (tmp_path / "reports" / "h200" / "vllm-options-0.26.0.json").write_text(json.dumps(_opts("0.26.0")))
    (tmp_path / "reports" / "empty").mkdir()
    e = audit.load_evidence(tmp_path / "reports" / "cpu-tiny", [tmp_path / "reports" / "h200", tmp_path / "nope",
                                                                tmp_path / "reports" / "empty"],
                            str(tmp_path / "reports" / "*" / "vllm-options-*.json"), introspect_installed=False,
                            configs=())
    assert [r.label for r in e.reports] == ["cpu-tiny", "h200"]
    assert list(e.reports[0].summaries) == [STEMS["01"]]  # the audit's own summary is not evidence
    assert [i["version"] for i in e.vllm] == ["0.26.0"]
    assert any("nope" in n and "not found" in n for n in e.notes)
    assert any("empty" in n and "left out" in n for n in e.notes)
    links = audit.links(audit.CLAIMS_BY_ID[4], e)
    assert {x["href"] for x in links} == {"01_kv_dtype_auto_vs_fp8.html", "../h200/01_kv_dtype_auto_vs_fp8.html"}
    assert {x["href"] for x in audit.links(audit.CLAIMS_BY_ID[15], e)} == {"../h200/vllm-options-0.26.0.json"}
    f = run(4, e)
    assert f.by_report == {"cpu-tiny": DEPENDS, "h200": DEPENDS}


def test_spec_checks_and_report_dir_from_the_runner(monkeypatch, tmp_path):
    with pytest.raises(SpecError, match="AuditSpec.other_reports"):
        audit.AuditSpec(other_reports="reports/h200")
    with pytest.raises(SpecError, match="AuditSpec.introspect_installed"):
        audit.AuditSpec(introspect_installed="yes")
    monkeypatch.setenv("FP8LAB_REPORT_DIR", str(tmp_path))
    assert audit.AuditSpec.from_params({"REPORT_DIR": None}).resolved_report_dir() == tmp_path
    monkeypatch.delenv("FP8LAB_REPORT_DIR")
    assert audit.AuditSpec().resolved_report_dir() == CONFIGS_DIR.parent.parent / "reports" / "cpu-tiny"
    spec = audit.AuditSpec.from_params({"OTHER_REPORTS": ["a", "b"], "INTROSPECT_INSTALLED": False})
    assert spec.other_reports == ("a", "b") and spec.introspect_installed is False


def test_summary_and_index_page_show_the_audit_first(tmp_path):
    e = ev(rep("cpu-tiny", s01=_cap(31, 63)), vllm=(_opts("0.32.0"),), configs=audit.default_configs())
    rows = audit.audit(e)
    values = audit.summary_values(rows, e)
    assert values["verdicts"]["4"] == DEPENDS and values["verdicts"]["15"] == REFUTED
    assert sum(values["verdict_counts"].values()) == 15
    json.dumps(values)  # JSON-safe as recorded
    summary = {"profile": "cpu-tiny", "created_utc": "2026-11-29T00:00:00+00:00", "provenance": {},
               "notebooks": {"01_x": {"status": "ok", "html": "01_x.html", "wall_s": 1.0, "summary": {"a": 1},
                                      "from": "earlier run",
                                      "ran_on": {"date_utc": "2026-11-28T00:00:00+00:00", "device": "NVIDIA H200",
                                                 "fp8lab_commit": "abc", "vllm": "0.26.0"}},
                             "02_y": {"status": "ok", "html": "02_y.html", "summary": {"b": 2}, "from": "file"},
                             "03_z": {"status": "ok", "html": "03_z.html", "summary": {"c": 3}, "from": "earlier run",
                                      "ran_on": {"date_utc": "2026-11-28T01:00:00+00:00", "device": "CPU: x",
                                                 "fp8lab_commit": "def", "fp8lab_dirty": True, "vllm": "0.32.0"}},
                             "05_claims_audit": {"status": "ok", "html": "05_claims_audit.html", "wall_s": 2.0,
                                                 "summary": values}}}
    page = write_index(tmp_path, summary).read_text()
    assert page.index("Claims audit") < page.index("<h2>Studies</h2>")
    assert "class='v-refuted'" in page and "class='v-depends'" in page
    assert "<td>audit_rows</td>" not in page  # the rows are the table, not a blob under key numbers
    assert '<a href="05_claims_audit.html">the audit notebook</a>' in page
    # each kept notebook says where it ran (the H200 entry is not relabelled with this call's machine)
    assert "(kept from earlier run: 2026-11-28T00:00:00+00:00 on NVIDIA H200, fp8lab abc, vLLM 0.26.0)" in page
    assert "(kept from file: provenance in its engines&#x27; records)" in page
    assert "on CPU: x, fp8lab def with uncommitted changes, vLLM 0.32.0)" in page


def test_a_partial_run_keeps_earlier_notebooks(tmp_path):
    from fp8lab.report import previous_entries

    (tmp_path / "summary.json").write_text(json.dumps({"profile": "cpu-tiny", "notebooks": {
        "00_a": {"notebook": "00_a", "status": "ok", "summary": {"x": 1}}}}))
    (tmp_path / "01_b.summary.json").write_text(json.dumps({"y": 2}))
    (tmp_path / "01_b.html").write_text("<html></html>")
    e = previous_entries(tmp_path, "cpu-tiny")
    assert e["00_a"]["from"] == "earlier run" and e["00_a"]["summary"] == {"x": 1}
    assert e["01_b"]["from"] == "file" and e["01_b"]["html"] == "01_b.html" and e["01_b"]["summary"] == {"y": 2}
    assert list(previous_entries(tmp_path, "h200")) == ["01_b"]  # another profile's summary.json is not merged


def test_claim12_uses_the_ramp_engine_as_its_block_size_point():
    s = {**_sweep({256: 5.0}), "block_size": 16, "fp8.c1.L8160.e2e_p50_s": 10.0}  # the H200 profile's shape
    f = run(12, ev(rep(s04=s)))
    assert f.verdict == CONFIRMED and f.details["p"]["fp8"]["ref_block"] == 16 and "not 128K" in f.on_what
