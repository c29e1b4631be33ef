"""Serving metrics, the roofline bound and the serving study's plan and analyses, with hand-computed
expectations (no vLLM: the analyses run on synthetic engine results from a fake runner)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fp8lab import metrics, roofline, serving
from fp8lab.paths import CONFIGS_DIR
from fp8lab.specs import EngineSpec, SpecError
from fp8lab.workloads import RequestClass

TINY_CONFIG = {  # the shipped model's shape (fp8lab-tiny-qwen3)
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "torch_dtype": "bfloat16",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 8192,
    "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
}


# ------------------------------------------------------------------------------------------ percentiles
def test_percentiles_of_small_arrays():
    # numpy linear interpolation: position q/100 * (n - 1) between order statistics
    p = metrics.percentiles([4, 1, 3, 2])
    assert p["n"] == 4 and p["mean"] == 2.5
    assert p["p50"] == pytest.approx(2.5)
    assert p["p95"] == pytest.approx(1 + 0.95 * 3)  # 3.85
    assert p["p99"] == pytest.approx(1 + 0.99 * 3)  # 3.97
    one = metrics.percentiles([7.0])
    assert one["p50"] == one["p99"] == one["mean"] == 7.0


def test_percentiles_drop_nan_and_handle_empty():
    assert metrics.percentiles([1.0, float("nan"), 3.0, float("inf")])["p50"] == pytest.approx(2.0)
    empty = metrics.percentiles([])
    assert empty["n"] == 0 and math.isnan(empty["p50"]) and math.isnan(empty["mean"])


def test_explode_itl_and_latency_table():
    rec = pd.DataFrame(
        {
            "kv_dtype": ["auto", "auto", "fp8"],
            "cls": ["a", "a", "a"],
            "ttft_s": [0.1, 0.3, 0.2],
            "tpot_s": [0.01, 0.02, 0.03],
            "e2e_s": [1.0, 2.0, 3.0],
            "itl_s": [[0.01, 0.02], [0.03], [0.04, 0.05, 0.06]],
        }
    )
    ex = metrics.explode_itl(rec, keep=("kv_dtype",))
    assert len(ex) == 6 and ex.gap.tolist() == [0, 1, 0, 0, 1, 2]
    assert ex[ex.kv_dtype == "auto"].itl_s.tolist() == [0.01, 0.02, 0.03]
    t = metrics.latency_table(rec).set_index(["kv_dtype", "metric"])
    assert t.loc[("auto", "ttft_ms"), "p50"] == pytest.approx(200.0)  # median of 100 ms and 300 ms
    assert t.loc[("auto", "itl_ms"), "n"] == 3 and t.loc[("auto", "itl_ms"), "p50"] == pytest.approx(20.0)
    assert t.loc[("fp8", "e2e_ms"), "mean"] == pytest.approx(3000.0)


def test_throughput_and_achieved_rate():
    tp = metrics.throughput(prompt_tokens=100, output_tokens=50, wall_s=2.0, requests=4)
    assert tp == {"input_tok_s": 50.0, "output_tok_s": 25.0, "total_tok_s": 75.0, "requests_s": 2.0}
    assert metrics.achieved_rate([1.5, 0.0, 0.5, 1.0]) == pytest.approx(2.0)  # 3 gaps in 1.5 s
    assert math.isnan(metrics.achieved_rate([0.3]))


def test_ecdf():
    x, f = metrics.ecdf([3, 1, 2, float("nan")])
    assert x.tolist() == [1, 2, 3] and f.tolist() == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_decode_steps_hand_computed():
    # r0: sent 0, first token at 1.0, then 2.0, 3.0 (prompt 10); r1: sent 0.5, tokens at 1.5, 2.5 (prompt 20)
    rec = pd.DataFrame(
        {"sent_s": [0.0, 0.5], "ttft_s": [1.0, 1.0], "prompt_tokens": [10, 20], "itl_s": [[1.0, 1.0], [1.0]]}
    )
    s = metrics.decode_steps(rec).sort_values("t_s").reset_index(drop=True)
    assert s.t_s.tolist() == [2.0, 2.5, 3.0]
    assert s.batch.tolist() == [2, 2, 1]
    # t=2.0: prompts 30 + tokens before (1.0, 1.5) = 32; t=2.5: 30 + 3 = 33; t=3.0: r1 done -> 10 + 2 = 12
    assert s.kv_tokens.tolist() == [32, 33, 12]
    assert s.context.tolist() == [11, 21, 12]


# -------------------------------------------------------------------------------------------- roofline
def test_itl_lower_bound_hand_computed():
    # 1 GB of weights + 1000 tokens x 100 kB at 1 TB/s = 1.1 ms
    assert roofline.itl_lower_bound(1e9, 1000, 1e5, 1e12) == pytest.approx(1.1e-3)
    assert roofline.fp8_speedup_bound(1e9, 1e4, 1e5, 5e4) == pytest.approx(2e9 / 1.5e9)
    assert roofline.fp8_speedup_bound(0, 1e4, 1e5, 5e4) == pytest.approx(2.0)  # KV only: at most x2
    with pytest.raises(SpecError):
        roofline.itl_lower_bound(1, 1, 1, 0)


def test_weight_bytes_of_the_tiny_model_by_hand():
    # embed 8192*256 (tied, read once by the LM head) + 6 x (q 256*256 + k,v 2*256*128 + o 256*256 + norms 512
    # + MLP 3*256*768) + final norm 256 = 6,819,072 parameters x 2 bytes
    assert roofline.weight_bytes_per_step(TINY_CONFIG) == 13_638_144


def test_untied_embeddings_are_not_read_per_step():
    from fp8lab import kvmath

    q8 = CONFIGS_DIR / "qwen3-8b"
    total = kvmath.estimate_param_bytes(q8)
    assert roofline.weight_bytes_per_step(q8) == total - 151936 * 4096 * 2


def test_bound_grid_hand_computed():
    rows = roofline.bound_grid(TINY_CONFIG, 20.0, [512], [4], ("auto", "fp8"))
    auto, fp8 = rows
    # KV per token: 6 layers x 2 heads x (64 + 64) x 2 bytes = 3072 (auto), 1536 (fp8)
    assert auto["kv_bytes_per_token"] == 3072 and fp8["kv_bytes_per_token"] == 1536
    assert auto["kv_tokens"] == 2048 and auto["kv_bytes"] == 2048 * 3072
    assert auto["itl_bound_s"] == pytest.approx((13_638_144 + 2048 * 3072) / 20e9)  # 0.99648 ms
    assert fp8["itl_bound_s"] == pytest.approx((13_638_144 + 2048 * 1536) / 20e9)


# ------------------------------------------------------------------------------------------ the plan
@pytest.fixture
def engine(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    return EngineSpec(
        model=str(tmp_path), kv_cache_gib=0.0234375, max_model_len=2048, load_format="dummy", skip_tokenizer_init=True
    )


MIX = [["short", 128, 16, 6], ["medium", 512, 32, 3], ["long", 1536, 64, 1]]


def _plan(engine, **kw):
    base = dict(
        mix=MIX,
        concurrency=[1, 4],
        closed_loop_requests=6,
        rates=[5.0],
        open_loop_requests=6,
        warmup_requests=2,
        capacity_shape=(96, 64),
        capacity_factors=(),
        prompt_source="random",
    )
    base.update(kw)
    return serving.ServingPlan(engine, **base)


def test_trial_order_interleaves():
    assert serving.trial_order(["auto", "fp8"], 3) == [
        (0, "auto"),
        (0, "fp8"),
        (1, "auto"),
        (1, "fp8"),
        (2, "auto"),
        (2, "fp8"),
    ]


def test_plan_validation_names_the_field(engine):
    for kw, field in (
        (dict(trials=2), "trials"),
        (dict(kv_dtypes=["auto"]), "kv_dtypes"),
        (dict(kv_dtypes=["auto", "fp9"]), "kv_dtypes"),
        (dict(rates=[0.0]), "rates"),
        (dict(arrivals=["burst"]), "arrivals"),
        (dict(capacity_shape=(2000, 100)), "capacity_shape"),
        (dict(mix=[["huge", 2000, 100]]), "mix[huge]"),
        (dict(prompt_source="web"), "prompt_source"),
        (dict(naive_concurrency=[2]), "naive_concurrency"),
    ):
        with pytest.raises(SpecError) as err:
            _plan(engine, **kw)
        assert err.value.field == field, (kw, str(err.value))


def test_capacity_arithmetic(engine):
    # 24 MiB / (128 tokens x 3072 B) = 64 blocks (auto), 128 (fp8); 96 + 64 tokens -> 2 blocks per request
    assert serving.predicted_blocks(engine.replace(kv_cache_dtype="auto"), 128) == 64
    assert serving.predicted_blocks(engine.replace(kv_cache_dtype="fp8"), 128) == 128
    assert serving.concurrency_limit(64, 128, 160) == 32
    assert serving.capacity_ladder(32, (0.5, 1.5)) == (16, 31, 32, 33, 48)
    assert serving.capacity_ladder(1, ()) == (1, 2)
    plan = _plan(engine, concurrency=[])
    # mean context of the mix: (6*144 + 3*544 + 1*1600) / 10 = 409.6 -> 4 blocks; fp8: 128 // 4 = 32
    assert serving.mean_context(plan.mix) == pytest.approx(409.6)
    assert serving.resolve_concurrency(plan, {"auto": (64, 128), "fp8": (128, 128)}) == (1, 2, 4, 8, 16, 32)


def test_phase_names_round_trip(engine):
    plan = _plan(engine)
    phases = serving.build_phases(plan, "fp8", 0, (1, 4), capacity_predicted=32)
    names = [p.name for p in phases]
    assert names == [
        "warmup",
        "closed-c1",
        "closed-c4",
        "open-constant-5",
        "open-poisson-5",
        "cap-c31",
        "cap-c32",
        "cap-c33",
    ]
    # a closed-loop pool holds max(CLOSED_LOOP_REQUESTS, 4 N) requests: 6 at c=1, 16 at c=4
    assert [len(p.requests) for p in phases] == [2, 6, 16, 6, 6, 31, 32, 33]
    assert all(r.tag == "trial0" for p in phases for r in p.requests)
    assert serving.phase_meta("open-poisson-5")["rate"] == 5.0
    cap = serving.phase_meta("cap-c31")
    assert (cap["kind"], cap["concurrency"], cap["process"]) == ("capacity", 31, None) and math.isnan(cap["rate"])
    assert serving.phase_meta("closed-c16")["concurrency"] == 16 and serving.phase_meta("what")["kind"] == "other"
    # the warm-up (once per engine) and the capacity ladder run only in the first trial; same requests in every trial
    later = serving.build_phases(plan, "fp8", 1, (1, 4), capacity_predicted=32)
    assert [p.name for p in later] == ["closed-c1", "closed-c4", "open-constant-5", "open-poisson-5"]
    assert later[0].requests[0].prompt_token_ids == phases[1].requests[0].prompt_token_ids


def test_naive_phases_reuse_the_closed_loop_requests(engine):
    plan = _plan(engine, naive_concurrency=[4])
    phases = {p.name: p for p in serving.build_phases(plan, "auto", 0, (1, 4), capacity_predicted=None)}
    naive, closed = phases["naive-c4"], phases["closed-c4"]
    assert naive.client == "final" and closed.client == "stream" and naive.concurrency == 4
    assert [r.prompt_token_ids for r in naive.requests] == [r.prompt_token_ids for r in closed.requests]
    meta = serving.phase_meta("naive-c4")
    assert (meta["kind"], meta["concurrency"]) == ("naive", 4)
    names = [
        m.name
        for m in serving.headline_metrics(
            type("R", (), {"plan": plan, "concurrency": (1, 4), "headline_concurrency": 4})()
        )
    ]
    assert "output tok/s (no stream) @c=4" in names and "output tok/s (no stream) @c=1" not in names


def test_bench_args_mirror_the_spec(engine):
    args = serving.bench_args(engine.replace(kv_cache_dtype="fp8"), 512, 128, 32, 4, "/tmp/x.json", tokenizer="tok")
    s = " ".join(args)
    for frag in (
        "--kv-cache-dtype fp8",
        "--random-input-len 512",
        "--random-output-len 128",
        "--num-prompts 32",
        "--random-range-ratio 0",
        "--no-enable-prefix-caching",
        "--enforce-eager",
        "--tokenizer tok",
        "--max-model-len 2048",
        f"--kv-cache-memory-bytes {int(0.0234375 * 2**30)}",
        "--load-format dummy",
    ):
        assert frag in s, frag


# ------------------------------------------------------------- the analyses on a synthetic (fake) study
class _FakeEngine:
    """A stand-in for one engine process of the paired design (no vLLM): deterministic records; fp8's
    inter-token gaps are ``slow_fp8`` x auto's, trials differ by +-2%; a capacity phase preempts when its
    concurrency exceeds ``capacity_true``. Every phase it serves is logged in ``calls`` as ``(dtype, key)``."""

    def __init__(self, spec, log_path, calls, slow_fp8=0.8, capacity_true=None):
        self.spec, self.calls, self.slow_fp8 = spec, calls, slow_fp8
        self.capacity_true = capacity_true or {"auto": 31, "fp8": 63}

    def start(self):
        blocks = 64 if self.spec.kv_cache_dtype == "auto" else 128
        return {
            "status": "ready",
            "provenance": {},
            "engine": {
                "num_blocks": blocks,
                "block_size": 128,
                "kv_capacity_tokens": blocks * 128,
                "kv_budget_bytes": int(0.0234375 * 2**30),
                "engine_start_s": 30.0,
                "mem_after_start_bytes": 2**30,
            },
        }

    def run(self, payload):
        dt = self.spec.kv_cache_dtype
        self.calls.append((dt, payload["key"]))
        trial = int(payload["key"].split(":")[0].removeprefix("t"))
        f = (self.slow_fp8 if dt == "fp8" else 1.0) * (1.0 + 0.02 * (trial - 1))
        meta = serving.phase_meta(payload["name"])
        pre = 1 if meta["kind"] == "capacity" and meta["concurrency"] > self.capacity_true[dt] else 0
        recs, t_end = [], 0.0
        for i, r in enumerate(payload["requests"]):
            sent = r["arrival_s"] if r["arrival_s"] is not None else 0.01 * i
            itl = [0.01 * f * (1 + 0.1 * (k % 3)) for k in range(r["max_tokens"] - 1)]
            ttft = 0.05 * f * (1 + len(r["prompt_token_ids"]) / 1000)
            recs.append(
                {
                    "phase": payload["name"],
                    "request": i,
                    "cls": r["cls"],
                    "tag": r["tag"],
                    "prompt_tokens": len(r["prompt_token_ids"]),
                    "sent_s": sent,
                    "output_tokens": r["max_tokens"],
                    "finish_reason": "length",
                    "ttft_s": ttft,
                    "e2e_s": ttft + sum(itl),
                    "itl_s": itl,
                    "tpot_s": sum(itl) / len(itl),
                    "merged_deltas": 0,
                    "num_preemptions": pre if i == 0 else 0,
                }
            )
            t_end = max(t_end, sent + ttft + sum(itl))
        stats = {
            "wall_s": t_end,
            "requests": len(recs),
            "prompt_tokens": sum(r["prompt_tokens"] for r in recs),
            "output_tokens": sum(r["output_tokens"] for r in recs),
            "preemptions": float(pre),
            "kv_usage_peak": 0.5,
            "mem_peak_bytes": 2**30,
        }
        return {
            "status": "ok",
            "rows": recs,
            "stats": stats,
            "samples": [{"t_s": 0.25, "phase": payload["key"], "kv_usage": 0.4, "mem_bytes": 2**30}],
        }

    def stop(self):
        pass


@pytest.fixture
def fake_study(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("FP8LAB_RUNS", str(tmp_path / "runs"))
    plan = _plan(engine, capacity_factors=(0.5,))
    calls = []
    res = serving.run_study(plan, progress=False, engine_factory=lambda spec, log: _FakeEngine(spec, log, calls))
    return res, calls


def test_run_study_order_and_frames(fake_study):
    res, calls = fake_study
    # both engines serve every phase, back to back, the first alternating by phase and by trial
    plan = res.plan
    assert [(d, k) for d, k in calls] == [
        (d, f"t{t}:{n}")
        for t, n, d in serving.schedule_table(plan)[["trial", "phase", "kv_dtype"]].itertuples(index=False)
    ]
    assert calls[:2] == [("auto", "t0:warmup"), ("fp8", "t0:warmup")]  # one warm-up per engine, trial 0 only
    firsts = [
        calls[i][0]
        for i in range(len(calls) - 1)
        if calls[i][1] == calls[i + 1][1] and calls[i][1].endswith(":closed-c1")
    ]
    assert firsts == ["auto", "fp8", "auto"]  # closed-c1 in trials 0, 1, 2
    assert res.concurrency == (1, 4)
    assert len(res.engines) == 6 and (res.engines.status == "ok").all()
    assert set(res.records.kind) == {"warmup", "closed", "open", "capacity"}
    assert set(res.phases[res.phases.kind == "capacity"].trial) == {0}  # capacity search in trial 0 only
    assert set(res.phases[res.phases.kind == "warmup"].trial) == {0}
    # a second call loads the six stored runs instead of starting engines
    again = []
    res2 = serving.run_study(plan, progress=False, engine_factory=lambda spec, log: _FakeEngine(spec, log, again))
    assert again == [] and len(res2.records) == len(res.records)


def test_a_store_only_rerender_of_the_paired_design_starts_no_engine(engine, tmp_path, monkeypatch):
    """$FP8LAB_STORE_ONLY (re-rendering committed reports): the trials the store has are loaded, a missing one
    is an ``error`` result naming the store, and no engine is started for it."""
    monkeypatch.setenv("FP8LAB_RUNS", str(tmp_path / "runs"))
    plan = _plan(engine, capacity_factors=(0.5,))
    calls = []
    full = serving.run_study(plan, progress=False, engine_factory=lambda spec, log: _FakeEngine(spec, log, calls))
    assert len(full.engines) == 6 and calls
    monkeypatch.setenv("FP8LAB_STORE_ONLY", "1")
    started = []

    def factory(spec, log):
        started.append(spec.kv_cache_dtype)
        return _FakeEngine(spec, log, [])

    again = serving.run_study(plan, progress=False, engine_factory=factory)  # everything stored: loaded
    assert started == [] and len(again.records) == len(full.records)
    gone = sorted((tmp_path / "runs").glob("*/*/engine.json"))
    assert len(gone) == 6
    import shutil

    shutil.rmtree(gone[0].parent)  # one trial's run lost
    part = serving.run_study(plan, progress=False, engine_factory=factory)
    assert started == []
    bad = part.engines[part.engines.status != "ok"]
    assert len(bad) == 1 and "FP8LAB_STORE_ONLY is set, so no engine was started" in bad.error.iloc[0]
    assert not list((tmp_path / "runs").glob("*/paired-*"))  # no progress folder: nothing was to be measured


def test_capacity_tables(fake_study):
    res, _ = fake_study
    cap = serving.capacity_table(res).set_index("kv_dtype")
    assert cap.loc["fp8", "ratio_vs_baseline"] == 2.0 and cap.loc["auto", "predicted_blocks"] == 64
    ladder, search = serving.capacity_search(res)
    s = search.set_index("kv_dtype")
    assert s.loc["auto", "measured"] == 31 and s.loc["auto", "first_preempted"] == 32
    assert s.loc["auto", "predicted"] == 32 and s.loc["auto", "predicted_vllm"] == 31  # (64 - 1) // 2
    assert s.loc["fp8", "measured"] == 63 and s.loc["fp8", "predicted_vllm"] == 63
    assert set(ladder[ladder.kv_dtype == "auto"].concurrency) == {16, 31, 32, 33}


def test_deltas_find_a_20_percent_itl_gain_and_noise_floor(fake_study):
    res, _ = fake_study
    d = serving.delta_table(res).set_index("metric")
    # fp8's gaps are 0.8 x auto's in every trial: TPOT and ITL percentiles -20%, clearly outside noise
    for m in ("TPOT P50 @c=4", "ITL P99 @c=4", "TPOT P99 @c=1"):
        assert d.loc[m, "delta_pct"] == pytest.approx(-20.0, abs=0.5), m
        assert d.loc[m, "label"] == "better" and d.loc[m, "hi_pct"] < 0
    # trials differ by 2% steps (0.98, 1.00, 1.02): consecutive self-differences 2.04% and 2% in each dtype,
    # so the floor (their median) is 2.02%, not the largest difference between two trials (4.08%)
    assert d.loc["TPOT P50 @c=4", "noise_floor_pct"] == pytest.approx(100 * ((1 / 0.98 - 1) + 0.02) / 2, rel=1e-3)
    assert d.loc["TPOT P50 @c=4", "n"] == 3
    assert d.loc["TPOT P50 @c=4", "beyond_noise_floor"]
    assert {"output tok/s @c=1", "TTFT P99 @poisson 5/s"} <= set(d.index)


def test_open_loop_and_summary(fake_study):
    res, _ = fake_study
    ol = serving.open_loop_table(res)
    const = ol[ol.process == "constant"].iloc[0]
    assert const.scheduled_rate == pytest.approx(5.0) and const.achieved_rate == pytest.approx(5.0)
    assert const.send_lag_max_ms == pytest.approx(0.0, abs=1e-9)
    d = serving.delta_table(res)
    cap = serving.capacity_table(res)
    _, search = serving.capacity_search(res)
    s = serving.summary_values(res, d, cap, search, ol, bandwidth={"bandwidth_gbs": 20.0, "source": "parameter"})
    assert s["capacity_ratio"] == 2.0 and s["max_concurrency_measured_fp8"] == 63
    assert s["throughput_delta_label"] in ("better", "worse", "within noise")
    assert "fp8: TPOT P50 @c=4" in s["deltas"] and s["open_loop_rate_error_max"] == pytest.approx(0.0, abs=1e-9)
    text = serving.verdict(res, d, cap, search)
    assert "x2.00" in text and "Throughput" in text


def test_roofline_tables_on_the_fake_study(fake_study):
    res, _ = fake_study
    roof = serving.roofline_tables(res, 20.0)
    g = roof["grid"]
    assert set(g.kv_dtype) == {"auto", "fp8"} and (g[g.kv_dtype == "auto"].speedup_bound_vs_baseline == 1.0).all()
    assert (g[g.kv_dtype == "fp8"].speedup_bound_vs_baseline > 1.0).all()
    m = roof["measured"]
    assert len(m) and (m.bound_over_measured > 0).all()


def test_request_class_mix_parsing(engine):
    plan = _plan(engine)
    assert plan.mix[0] == RequestClass("short", 128, 16, 6)
